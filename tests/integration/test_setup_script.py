"""scripts/setup.sh says what its first run does and how long it takes, and nothing once .venv is complete.

The real first run takes a minute of both CPUs (a venv, torch from disk); here `python3`
and the venv's python are stand-ins that record what they are asked, so the test checks
the script's own behaviour: its messages and the commands it runs, in order.
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
FAKE_PYTHON3 = """#!/usr/bin/env bash
echo "python3 $*" >> "$CALLS"
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin" && cp "$VENV_PYTHON" "$3/bin/python"
  exit 0
fi
exec "$REAL_PYTHON" "$@"
"""
FAKE_VENV_PYTHON = """#!/usr/bin/env bash
echo "venv-python $*" >> "$CALLS"
case "$1 $2" in
  "-c "*entry_points*) exit "${VENV_ENTRY_POINTS:-0}" ;;
  "-c import triton") exit "${VENV_TRITON:-0}" ;;
  "-c "*) exit "${VENV_COMPLETE:-1}" ;;
esac
exit 0
"""


def make_script(path: pathlib.Path, text: str) -> str:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def run_setup(tmp_path: pathlib.Path, complete: bool = False, entry_points: bool = True,
              triton: bool = True) -> subprocess.CompletedProcess:
    project, stubs = tmp_path / "project", tmp_path / "stubs"
    (project / "scripts").mkdir(parents=True, exist_ok=True)
    stubs.mkdir(exist_ok=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", project / "scripts" / "setup.sh")
    make_script(stubs / "python3", FAKE_PYTHON3)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls"),
           "REAL_PYTHON": sys.executable, "VENV_PYTHON": make_script(tmp_path / "venv-python", FAKE_VENV_PYTHON),
           "VENV_COMPLETE": "0" if complete else "1", "VENV_ENTRY_POINTS": "0" if entry_points else "1", "VENV_TRITON": "0" if triton else "1"}
    return subprocess.run(["bash", str(project / "scripts" / "setup.sh")], capture_output=True, text=True,
                          timeout=60, env=env)


def test_the_first_run_says_what_it_does_and_roughly_how_long(tmp_path):
    result = run_setup(tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert any("creating" in line and ".venv" in line for line in lines), result.stderr
    assert any("about a minute" in line for line in lines), result.stderr
    assert lines[-1].startswith("setup: .venv ready after "), result.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert any(call.startswith("python3 -m venv .venv") for call in calls), calls
    assert any(call.startswith("venv-python -m pip install") and "torch==2.13.0" in call and "triton==" in call
               for call in calls), calls


def test_a_complete_venv_is_left_alone_silently(tmp_path):
    first = run_setup(tmp_path)
    assert first.returncode == 0
    (tmp_path / "calls").unlink()
    again = run_setup(tmp_path, complete=True)
    assert again.returncode == 0 and again.stdout == "" and again.stderr == ""
    checks = re.findall(r'\.venv/bin/python -c "([^"]+)"', (ROOT / "scripts" / "setup.sh").read_text())
    completeness, entry_points = [c for c in checks if "import engramd" in c], [c for c in checks if "entry_points" in c]
    assert len(completeness) == len(entry_points) == 1, checks
    assert (tmp_path / "calls").read_text().splitlines() == [f"venv-python -c {completeness[0]}",
                                                           "venv-python -c import triton",
                                                           f"venv-python -c {entry_points[0]}"]


def test_a_venv_without_triton_gets_it_for_the_interpreted_kernel_tests(tmp_path):
    first = run_setup(tmp_path)
    assert first.returncode == 0
    (tmp_path / "calls").unlink()
    again = run_setup(tmp_path, complete=True, triton=False)
    assert again.returncode == 0, again.stderr
    assert "installing Triton" in again.stderr and "CPU interpreter" in again.stderr
    last = (tmp_path / "calls").read_text().splitlines()[2]
    assert re.fullmatch(r"venv-python -m pip install -q triton==3\.\d+\.\d+", last), last


def test_a_venv_installed_before_an_entry_point_was_added_is_reinstalled(tmp_path):
    first = run_setup(tmp_path)
    assert first.returncode == 0
    (tmp_path / "calls").unlink()
    again = run_setup(tmp_path, complete=True, entry_points=False)  # no vllm.general_plugins entry point yet
    assert again.returncode == 0, again.stderr
    assert "package metadata changed" in again.stderr
    assert (tmp_path / "calls").read_text().splitlines()[-1] == "venv-python -m pip install -q --no-deps -e ."


def test_c_sources_newer_than_their_built_extension_are_rebuilt(tmp_path):
    first = run_setup(tmp_path)
    assert first.returncode == 0
    package = tmp_path / "project" / "engram_client" / "lookup" / "host"
    (package / "engine").mkdir(parents=True)  # the gather engine's sources sit a folder below its extension
    built, source = package / "_host_gather.cpython-311-x86_64-linux-gnu.so", package / "engine" / "pool.c"
    built.write_bytes(b"")
    source.write_text("/* changed */")
    os.utime(built, (1_000_000, 1_000_000))  # built long before the source changed
    (tmp_path / "calls").unlink()
    again = run_setup(tmp_path, complete=True)
    assert again.returncode == 0, again.stderr
    assert "rebuilding" in again.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[-1] == "venv-python -m pip install -q --no-deps -e .", calls
    os.utime(built)  # now newer than every source: left alone, silently
    (tmp_path / "calls").unlink()
    third = run_setup(tmp_path, complete=True)
    assert third.stderr == "" and len((tmp_path / "calls").read_text().splitlines()) == 3
