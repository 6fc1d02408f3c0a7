"""The main job works from any directory: ``engramd demo``, examples/engram_model.py and
scripts/demo.sh, run from a directory whose ``engramd/`` or ``engram_client/`` folder would
shadow the installed package for a child started as ``python -m engramd``.

Two real directories: the clone's parent (it holds the clone as ``engramd/``, a folder
without ``__init__.py``, here a link named so), and one holding decoy packages that end any
process importing them.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENGRAMD = os.path.join(os.path.dirname(sys.executable), "engramd")  # the installed console script
DEMO_ARGS = ["demo", "--ranks", "1", "--device", "cpu", "--lookups", "2", "--ids-per-lookup", "64"]
TIMEOUT_S = 300


def clone_parent(base: pathlib.Path) -> pathlib.Path:
    (base / "engramd").symlink_to(ROOT, target_is_directory=True)  # `git clone .../engramd` made this
    return base


def decoys(base: pathlib.Path) -> pathlib.Path:
    for package in ("engramd", "engram_client"):
        (base / package).mkdir()
        (base / package / "__init__.py").write_text(f"raise SystemExit('decoy {package} imported from the cwd')\n")
    return base


@pytest.fixture(params=[clone_parent, decoys], ids=["clone-parent", "decoy-packages"])
def elsewhere(request, tmp_path):
    return request.param(tmp_path)


def run(argv: list[str], cwd: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))


def test_demo_passes_from_another_directory(elsewhere):
    if not os.path.exists(ENGRAMD):
        pytest.skip("the engramd console script is not installed beside this interpreter")
    result = run([ENGRAMD, *DEMO_ARGS], elsewhere)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.stdout.rstrip().endswith("demo passed")
    assert "decoy" not in result.stdout + result.stderr


def test_example_model_passes_from_another_directory(elsewhere):
    result = run([sys.executable, str(ROOT / "examples" / "engram_model.py"), "--device", "cpu"], elsewhere)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.stdout.rstrip().endswith("engram model example passed")


def test_demo_script_runs_from_elsewhere_and_through_a_link(tmp_path):
    if not (ROOT / ".venv" / "bin" / "engramd").exists():
        pytest.skip("scripts/demo.sh would first create .venv (a minute of both CPUs)")
    (tmp_path / "cwd").mkdir()
    cwd = decoys(tmp_path / "cwd")
    link = tmp_path / "bin" / "engramd-demo"
    link.parent.mkdir()
    link.symlink_to(ROOT / "scripts" / "demo.sh")
    # Both at once: each demo is its own daemon on its own temp socket and shm dir, and a chain of
    # process starts that keeps at most one CPU busy; one after the other they took twice as long.
    scripts = (str(ROOT / "scripts" / "demo.sh"), str(link))
    demos = [subprocess.Popen([script, *DEMO_ARGS[1:]], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(os.environ, PYTHONUNBUFFERED="1")) for script in scripts]
    try:
        outputs = [demo.communicate(timeout=TIMEOUT_S) for demo in demos]
    finally:
        for demo in demos:
            if demo.poll() is None:
                demo.kill()
                demo.wait(timeout=30)
    for script, demo, (stdout, stderr) in zip(scripts, demos, outputs):
        assert demo.returncode == 0, f"{script}:\nstdout:\n{stdout}\nstderr:\n{stderr}"
        assert stdout.rstrip().endswith("demo passed")
