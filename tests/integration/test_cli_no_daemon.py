"""The command line when no daemon is there: an answer at once, the truth about what it waited for.

Real sockets: a path with no file, a socket file nothing listens on (what a killed
daemon leaves), and a listening socket that never answers (a hung daemon).
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from engramd.cli.main import main
from waiting import free_port

EXIT_UNREACHABLE = 3


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


# Each status request waits up to --timeout (10 s by default, test_status_timeout.py holds that);
# against nothing, 2 s shows the same outcome as 10.
SHORT_TIMEOUT = ("--timeout", "2")


@pytest.fixture
def endpoint(socket_dir):
    return f"ipc://{socket_dir}/engramd.sock"


@pytest.fixture
def stale_socket(socket_dir):
    """A socket file whose listener is gone, as a daemon killed with SIGKILL leaves it."""
    path = os.path.join(socket_dir, "engramd.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.close()
    return f"ipc://{path}"


@pytest.fixture
def hung_socket(socket_dir):
    """A socket that accepts connections and never says a word, as a hung daemon would."""
    path = os.path.join(socket_dir, "engramd.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(16)
    yield f"ipc://{path}"
    sock.close()


def test_status_without_a_socket_file_says_so(endpoint):
    result = cli("status", "--socket", endpoint)
    assert result.exit_code == EXIT_UNREACHABLE
    assert result.stderr.strip() == f"error: no engramd at {endpoint}: socket file missing"
    assert result.stdout == ""


@pytest.mark.parametrize("state_fixture, state, reason", [
    ("endpoint", "absent", "socket file missing"),
    ("stale_socket", "absent", "is stale: nothing listens on it"),
    ("hung_socket", "unreachable", "did not answer 'status'"),
])
def test_status_json_always_prints_an_object(request, state_fixture, state, reason):
    where = request.getfixturevalue(state_fixture)
    result = cli("status", "--json", "--socket", where, *SHORT_TIMEOUT)
    assert result.exit_code == EXIT_UNREACHABLE
    report = json.loads(result.stdout)
    assert report["state"] == state and report["endpoint"] == where
    assert reason in report["error"]
    assert f"error: {report['error']}" in result.stderr


def test_status_wait_reports_the_time_it_really_waited(endpoint):
    started = time.monotonic()
    result = cli("status", "--socket", endpoint, "--wait", "1.5", *SHORT_TIMEOUT)
    elapsed = time.monotonic() - started
    assert result.exit_code == EXIT_UNREACHABLE
    waited = float(re.search(r"socket file missing \(waited ([0-9.]+) s\)", result.stderr).group(1))
    assert 1.5 <= waited <= elapsed + 0.05


def test_a_hung_daemon_is_reported_with_the_time_waited_and_no_hint_to_rerun(hung_socket):
    started = time.monotonic()
    result = cli("status", "--socket", hung_socket, "--wait", "1.5", *SHORT_TIMEOUT)
    elapsed = time.monotonic() - started
    assert result.exit_code == EXIT_UNREACHABLE
    waited = float(re.search(r"did not answer 'status' within ([0-9.]+) s", result.stderr).group(1))
    assert 1.5 <= waited <= elapsed + 0.05
    assert "engramd status --socket" not in result.stderr  # the old hint repeated the command just run
    assert "socket file is there" in result.stderr


@pytest.mark.parametrize("where_fixture, reason", [("endpoint", "socket file missing"),
                                                   ("stale_socket", "is stale")])
def test_stop_with_nothing_to_stop_answers_at_once(request, where_fixture, reason):
    where = request.getfixturevalue(where_fixture)
    result = cli("stop", "--socket", where)
    assert result.exit_code == EXIT_UNREACHABLE
    assert reason in result.stderr and "nothing to stop" in result.stderr
    assert result.stderr.count("\n") == 1, "one error line"


def test_reload_without_a_daemon_says_so(endpoint):
    result = cli("reload", "--socket", endpoint)
    assert result.exit_code == EXIT_UNREACHABLE
    assert result.stderr.strip() == f"error: no engramd at {endpoint}: socket file missing"


def test_status_wait_still_waits_for_a_daemon_that_starts_later(daemon_factory, socket_dir):
    starter = threading.Timer(1.0, lambda: daemon_factory())
    starter.start()
    try:
        result = cli("status", "--socket", f"ipc://{socket_dir}/engramd.sock", "--wait", "60")
    finally:
        starter.join()
    assert result.exit_code == 0, result.output
    assert re.search(r"^state\s+ready$", result.stdout, re.M)


def test_silence_on_tcp_is_explained_without_talk_of_socket_files(tmp_path):
    from engramd.guards.curve_keys import create_keys
    from waiting import free_port

    keys = str(tmp_path / "keys")
    create_keys(keys)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    result = cli("status", "--json", "--socket", endpoint, "--curve-keys-dir", keys, *SHORT_TIMEOUT)
    assert result.exit_code == EXIT_UNREACHABLE
    report = json.loads(result.stdout)
    assert report["state"] == "unreachable" and "did not answer 'status'" in report["error"]
    assert "--remote-status" in report["error"] and "socket file" not in report["error"]


def engramd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The command line as a process, as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "engramd", *args], capture_output=True, text=True, timeout=60,
                          env=env)


@pytest.mark.parametrize("command", [("stop",), ("reload",)])
def test_stop_and_reload_on_tcp_say_tcp_serves_status_only(command):
    # Before, both advised a keys directory, which neither command takes.
    for args, env in (((*command, "--socket", f"tcp://127.0.0.1:{free_port()}"), None),
                      (command, {**os.environ, "ENGRAMD_SOCKET": f"tcp://127.0.0.1:{free_port()}"})):
        result = engramd(*args, env=env)
        assert result.returncode == 2, result.stderr
        lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert len(lines) == 1 and "over TCP engramd serves status only (--remote-status)" in lines[0], result.stderr
        assert "keys directory" not in result.stderr and "--socket ipc://" in lines[0]


@pytest.fixture
def regular_file(socket_dir):
    """A regular file of this user (root here) at the socket path."""
    path = os.path.join(socket_dir, "engramd.sock")
    with open(path, "w") as f:
        f.write("not a socket\n")
    return f"ipc://{path}"


@pytest.mark.parametrize("args", [("status",), ("status", "--wait", "1"), ("stop",), ("reload",)])
def test_a_regular_file_at_the_socket_path_is_called_not_a_socket(regular_file, args):
    # Before: "it is a non-socket file of uid 0 ... neither root, this user, nor a group of this
    # user", of root's own file, exit 4.  serve says what is wrong: it is not a socket.
    result = engramd(*args, "--socket", regular_file)
    assert result.returncode == EXIT_UNREACHABLE, result.stderr
    path = regular_file[len("ipc://"):]
    assert result.stderr.splitlines() == [f"error: no engramd at {regular_file}: {path} is a regular file, not a "
                                          "socket, so no engramd can answer there (engramd serve will not bind over "
                                          "it either): remove it, or give the daemon's socket"]
    with open(path) as f:
        assert f.read() == "not a socket\n"
