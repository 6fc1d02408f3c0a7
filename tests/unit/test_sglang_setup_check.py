"""scripts/setup.sh reinstalls a .venv whose metadata lacks an entry point: the SGLang plugin's counts too.

The check is setup.sh's own ``entry_points_current`` command, run as written (its ``python -c``
text, taken from the script) by a Python that sees only the package metadata written here.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

SETUP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "setup.sh")
ENTRY_POINTS = {"vllm.general_plugins": "engram_client.integrations.vllm:register",
                "sglang.srt.plugins": "engram_client.integrations.sglang:register"}


def check_code() -> str:
    with open(SETUP) as f:
        body = re.search(r"entry_points_current\(\) \{\n\s*\.venv/bin/python -c \"(.*)\"\n\}", f.read()).group(1)
    return body


def current(tmp_path, groups) -> int:
    info = tmp_path / "engramd-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: engramd\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text("".join(f"[{g}]\nengramd = {ENTRY_POINTS[g]}\n\n" for g in groups))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    # -S: no site-packages, and run here: not beside the checkout's engramd.egg-info either, so the
    # metadata written here is the only one the check can find.
    return subprocess.run([sys.executable, "-S", "-c", check_code()], env=env, cwd=tmp_path, timeout=60).returncode


def test_metadata_with_both_plugins_entry_points_is_current(tmp_path):
    assert current(tmp_path, ENTRY_POINTS) == 0


def test_metadata_without_the_sglang_entry_point_is_not(tmp_path):
    assert current(tmp_path, ["vllm.general_plugins"]) == 1
