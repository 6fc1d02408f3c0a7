"""What an operator sees for a bad command line or a bad setting: one ``error:`` line on stderr
(never click's usage block), naming the setting where it was set (the flag, the variable, or
the TOML file and key), in the units it was given in.  engramd runs as a real process.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROCESS_TIMEOUT_S = 60


def engramd(*args: str, env: dict[str, str] | None = None, cwd: str | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAMD_")}
    return subprocess.run([sys.executable, "-m", "engramd", *args], capture_output=True, text=True,
                          timeout=PROCESS_TIMEOUT_S, env={**environment, **(env or {})}, cwd=cwd)


def only_line(result: subprocess.CompletedProcess, exit_code: int) -> str:
    """stderr is exactly one ``error:`` line and the exit code is ``exit_code``."""
    lines = result.stderr.splitlines()
    assert result.returncode == exit_code, result.stdout + result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("args, says", [
    (["serve", "--bogus"], "No such option '--bogus'"),
    (["--bogus"], "No such option '--bogus'"),
    (["nosuch"], "No such command 'nosuch'"),
    (["status", "--wait"], "'--wait' requires an argument"),
    (["demo", "--ranks", "-1"], "'--ranks': -1 is not in the range"),
    (["demo", "--ranks", "0"], "'--ranks': 0 is not in the range"),
    (["demo", "--lookups", "0"], "'--lookups': 0 is not in the range"),
    (["demo", "--ids-per-lookup", "0"], "'--ids-per-lookup': 0 is not in the range"),
])
def test_a_usage_error_is_one_line(args, says):
    result = engramd(*args)
    line = only_line(result, 2)
    assert says in line and "--help" in line, line
    assert "demo passed" not in result.stdout and "engramd ready" not in result.stdout


@pytest.fixture
def toml(tmp_path):
    def write(text: str) -> str:
        path = tmp_path / "engramd.toml"
        path.write_text(text)
        return str(path)
    return write


def test_a_bad_toml_value_names_the_file_and_key(toml, shm_dir):
    path = toml('load_threads = "x"\n')
    line = only_line(engramd("serve", "--config", path, "--shm-dir", shm_dir), 2)
    assert f"load_threads in {path}" in line and "'x' is not a valid integer" in line, line
    assert "ENGRAMD_" not in line, line  # it was not set in the environment


def test_an_out_of_range_toml_value_names_the_file_and_key(toml, shm_dir, socket_dir):
    path = toml("load_threads = 0\n")
    line = only_line(engramd("serve", "--config", path, "--socket", f"ipc://{socket_dir}/s.sock",
                             "--shm-dir", shm_dir), 1)
    assert line == f"error: {path}: load_threads must be 1..256, got 0", line
    # --print-config refuses what serve refuses, in the same words and with the same exit code
    assert only_line(engramd("serve", "--config", path, "--print-config"), 1) == line


def test_toml_file_errors_name_the_file_not_the_variable(toml):
    path = toml("shm_dri = '/x'\n")
    line = only_line(engramd("serve", "--config", path), 2)
    assert path in line and "unknown settings shm_dri" in line and "ENGRAMD_CONFIG" not in line, line
    path = toml("reload_root = '/x'\n")
    line = only_line(engramd("serve", "--print-config", env={"ENGRAMD_CONFIG": path}), 2)
    assert f"{path}: reload_root must be a list" in line, line


def test_a_bad_value_names_the_variable_or_the_flag_that_set_it(shm_dir, socket_dir):
    where = ["--socket", f"ipc://{socket_dir}/s.sock", "--shm-dir", shm_dir]
    line = only_line(engramd("serve", *where, env={"ENGRAMD_LOAD_THREADS": "0"}), 1)
    assert line == "error: ENGRAMD_LOAD_THREADS must be 1..256, got 0", line
    line = only_line(engramd("serve", *where, env={"ENGRAMD_LOAD_THREADS": "x"}), 2)
    assert "ENGRAMD_LOAD_THREADS" in line and "'x' is not a valid integer" in line, line
    line = only_line(engramd("serve", *where, "--load-threads", "0"), 1)
    assert line == "error: --load-threads must be 1..256, got 0", line
    line = only_line(engramd("serve", *where, "--load-threads", "x"), 2)
    assert "'--load-threads'" in line and "ENGRAMD_LOAD_THREADS" not in line, line


def test_max_load_rate_is_refused_in_the_unit_it_was_given_in(shm_dir, socket_dir):
    line = only_line(engramd("serve", "--socket", f"ipc://{socket_dir}/s.sock", "--shm-dir", shm_dir,
                             "--max-load-rate", "-1"), 1)
    assert line == "error: --max-load-rate must be positive, got -1 MB/s", line


@pytest.mark.parametrize("endpoint, also", [
    ("/x", None),
    ("tcp://127.0.0.1:5555", "--remote-status"),
    ("inproc://engramd", "only the daemon's own process"),
])
def test_serve_suggests_only_the_endpoints_it_serves(endpoint, also, shm_dir):
    line = only_line(engramd("serve", "--socket", endpoint, "--shm-dir", shm_dir), 1)
    assert f"--socket {endpoint!r}" in line and "ipc://" in line, line
    assert "must start with" not in line and "or inproc://" not in line and "tcp:// or" not in line, line
    if also:
        assert also in line, line
