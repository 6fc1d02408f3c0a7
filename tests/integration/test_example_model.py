"""examples/engram_model.py end to end: its own engramd, a model that reads rows through it,
and the same model on reference rows, with identical outputs."""
from __future__ import annotations

import os
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "engram_model.py")
TIMEOUT_S = 300


def _leftovers() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("engram-model-")} \
        if os.path.isdir("/dev/shm") else set()


def test_example_model_matches_its_reference_on_cpu():
    before = _leftovers()
    result = subprocess.run([sys.executable, EXAMPLE, "--device", "cpu"], capture_output=True, text=True,
                            timeout=TIMEOUT_S, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "[cpu] 1536 rows looked up" in result.stdout and "0 bf16 values differ" in result.stdout
    assert "max |through engramd - reference rows| = 0.0" in result.stdout
    assert result.stdout.rstrip().endswith("engram model example passed")
    assert _leftovers() == before, "the example left its shm dir behind"
