"""A passing test run leaves nothing under the system temp dir.

pytest keeps every test's ``tmp_path`` of the last three runs unless told otherwise; here that
was some 550 MB a run (synthetic checkpoints, tables).  A real pytest run of one of our test
files, with a temp dir of its own, must leave no file behind (a failing test's ``tmp_path`` is
kept, for a look at what it left: pyproject.toml's ``tmp_path_retention_policy``).
"""
from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_passing_run_leaves_no_file_in_the_temp_dir(tmp_path):
    temp = tmp_path / "temp"
    temp.mkdir()
    result = subprocess.run([sys.executable, "-m", "pytest", "tests/unit/test_whole_files.py", "-q", "-n", "0",
                             "-p", "no:cacheprovider"], cwd=REPO, env={**os.environ, "TMPDIR": str(temp)},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    left = [os.path.join(directory, name) for directory, _, names in os.walk(temp) for name in names]
    assert left == [], left[:20]
