"""examples/engram_model.py end to end: its own engramd, a model that reads rows through it,
and the same model on reference rows, with identical outputs."""
from __future__ import annotations

import os
import re
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "engram_model.py")
TIMEOUT_S = 300


def test_example_model_matches_its_reference_on_cpu():
    result = subprocess.run([sys.executable, EXAMPLE, "--device", "cpu"], capture_output=True, text=True,
                            timeout=TIMEOUT_S, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "[cpu] 1536 rows looked up" in result.stdout and "0 bf16 values differ" in result.stdout
    assert "max |through engramd - reference rows| = 0.0" in result.stdout
    assert result.stdout.rstrip().endswith("engram model example passed")
    # Its own shm dir, as it says where it is (other runs on this machine may hold dirs of the same prefix).
    shm_dir = re.search(r"MiB in (\S+), layers", result.stdout).group(1)
    assert os.path.basename(shm_dir).startswith("engram-model-") and not os.path.exists(shm_dir), \
        f"the example left its shm dir {shm_dir} behind"
