"""engramd's SGLang plugin as SGLang 0.5.23 loads it: through ``load_plugins`` and the hook registry, in a fresh process.

The stand-in's ``sglang.srt.plugins`` replays SGLang's loader (tests/support/sglang_standin), which logs
and skips a plugin that raises an Exception: so each refusal here is checked to end the
process, not to leave SGLang serving its own tables.  The version is what importlib.metadata
finds for ``sglang`` (the stand-in's dist-info, or one written here first on the path).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from sglang_ranks import STANDIN
from torchless import SITE_DIR

CODE = """
import sys
from sglang.srt.plugins import load_plugins
load_plugins()
engram = sys.modules.get('sglang.srt.layers.engram')


def hook_of(method):
    cells = [c.cell_contents for c in getattr(method, '__closure__', None) or ()]
    return next((f'{c.__module__}.{c.__name__}' for c in cells if callable(c) and
                 getattr(c, '__module__', '').startswith('engram_client.')), None)


methods = ('__init__', '_owned_rows', '_load_rows', 'finish_load')
print('untouched' if engram is None else
      ' '.join(str(hook_of(getattr(engram.EngramEmbedding, name))) for name in methods))
print(sorted({m.partition('.')[0] for m in sys.modules} & {'torch', 'engram_client'}))
"""


def plugin_load(env: dict[str, str], first: list[str] = (), torchless: bool = False) -> subprocess.CompletedProcess:
    path = [*first, STANDIN, *([SITE_DIR] if torchless else []), os.environ.get("PYTHONPATH")]
    full = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p), **env}
    for name in ("ENGRAMD_SGLANG", "SGLANG_PLUGINS"):
        if name not in env:
            full.pop(name, None)
    return subprocess.run([sys.executable, "-P", "-c", CODE], env=full, capture_output=True, text=True, timeout=120)


def test_without_ENGRAMD_SGLANG_the_plugin_loads_nothing_and_hooks_nothing():
    for env in ({}, {"ENGRAMD_SGLANG": "0"}):
        result = plugin_load(env, torchless=True)  # torch cannot even be imported
        assert result.returncode == 0, result.stderr
        assert result.stdout.split("\n")[:2] == ["untouched", "['engram_client']"], result.stdout


def test_with_ENGRAMD_SGLANG_1_the_hook_registry_replaces_sglangs_embedding_methods():
    result = plugin_load({"ENGRAMD_SGLANG": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0].split() == [
        "engram_client.integrations.sglang.embedding.engramd_init", "engram_client.integrations.sglang.lookups.owned_rows",
        "engram_client.integrations.sglang.loading.load_rows", "engram_client.integrations.sglang.loading.finish_load"]
    # SGLANG_PLUGINS naming other plugins only: SGLang does not load this one.
    assert plugin_load({"ENGRAMD_SGLANG": "1", "SGLANG_PLUGINS": "other"}).stdout.startswith("untouched")


def test_an_unknown_ENGRAMD_SGLANG_value_ends_the_process_though_sglang_skips_failing_plugins():
    result = plugin_load({"ENGRAMD_SGLANG": "yes"})
    assert result.returncode == 1
    assert "engramd's SGLang plugin: ENGRAMD_SGLANG='yes': set it to 1" in result.stderr


def test_another_sglang_release_is_refused_naming_the_supported_one_and_the_pin(tmp_path):
    info = tmp_path / "sglang-0.5.24.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.24\n")
    result = plugin_load({"ENGRAMD_SGLANG": "1"}, first=[str(tmp_path)])
    assert result.returncode == 1
    assert ("engramd's sglang integration was run against sglang 0.5.23 only; this is sglang 0.5.24. Install one "
            "of those (pip install 'sglang==0.5.23', or pip install 'engramd[sglang]')") in result.stderr


def test_a_moved_sglang_surface_is_refused_before_any_hook_naming_the_item(tmp_path):
    changed = tmp_path / "standin"
    shutil.copytree(STANDIN, changed)
    engram = changed / "sglang" / "srt" / "layers" / "engram.py"
    engram.write_text(engram.read_text().replace("def _owned_rows(self, indices):",
                                                 "def _owned_rows(self, indices, out=None):"))
    result = plugin_load({"ENGRAMD_SGLANG": "1"}, first=[str(changed)])
    assert result.returncode == 1
    assert "cannot patch sglang 0.5.23: sglang.srt.layers.engram: EngramEmbedding._owned_rows is " \
           "(self, indices, out=None), expected (self, indices)" in result.stderr
    assert "Unset ENGRAMD_SGLANG" in result.stderr
