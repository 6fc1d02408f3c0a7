"""What engram_client/integrations promises about imports: nothing of the daemon side, and nothing heavy until asked.

vLLM imports every general plugin's entry point in each of its processes, and SGLang every
``sglang.srt.plugins`` one; with ENGRAMD_VLLM / ENGRAMD_SGLANG unset that import and the call must
cost nothing: no torch, no engine module.
"""
from __future__ import annotations

import ast
import os

import pytest

import engram_client.integrations
from torchless import run_torchless


def all_imports(root: str):
    """(file, module) for every import in every module under ``root``, lazy ones inside functions too."""
    for directory, _, files in os.walk(root):
        for file in files:
            if file.endswith(".py"):
                path = os.path.join(directory, file)
                with open(path) as f:
                    tree = ast.parse(f.read(), path)
                for node in ast.walk(tree):
                    if isinstance(node, ast.ImportFrom) and not node.level:
                        yield os.path.relpath(path, root), node.module or ""
                    elif isinstance(node, ast.Import):
                        for alias in node.names:
                            yield os.path.relpath(path, root), alias.name


def test_integrations_import_nothing_of_the_daemon_side():
    root = os.path.dirname(engram_client.integrations.__file__)
    found = list(all_imports(root))
    assert any(module == "torch" for _, module in found), "the walk saw no imports at all"
    offenders = [f"{file}: {module}" for file, module in found if module.partition(".")[0] == "engramd"]
    assert offenders == []


@pytest.mark.parametrize("engine, switch", [("vllm", "ENGRAMD_VLLM"), ("sglang", "ENGRAMD_SGLANG")])
def test_an_engines_entry_point_loads_and_runs_without_torch_or_the_engine_when_off(engine, switch):
    code = (f"import os, sys\nos.environ.pop('{switch}', None)\n"
            f"from engram_client.integrations.{engine} import register\nregister()\n"
            f"print(sorted(m for m in sys.modules if m.partition('.')[0] in ('torch', '{engine}')))\n")
    result = run_torchless(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
