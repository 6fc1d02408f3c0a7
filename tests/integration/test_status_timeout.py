"""How long ``engramd status`` waits for an answer: 10 s by default (README, the probes), or --timeout.

A real daemon made slow to answer with SIGSTOP (and SIGCONT), as an overloaded or
swapping daemon would be.
"""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from waiting import end_process

PROCESS_TIMEOUT_S = 60
EXIT_UNREACHABLE = 3


def waited_s(stderr: str) -> float:
    """The wait an unanswered status reports (``did not answer 'status' within 10.0 s``)."""
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, stderr
    match = re.search(r"did not answer 'status' within ([0-9.]+) s", lines[0])
    assert match, lines[0]
    return float(match.group(1))


@pytest.fixture
def stopped_daemon(demo_daemon):
    """A ready daemon that answers nothing until SIGCONT."""
    demo_daemon.proc.send_signal(signal.SIGSTOP)
    try:
        yield demo_daemon
    finally:
        demo_daemon.proc.send_signal(signal.SIGCONT)


@pytest.mark.parametrize("args, at_least", [((), 10.0), (("--timeout", "2"), 2.0)])
def test_an_unanswered_status_waits_as_long_as_it_says(stopped_daemon, args, at_least):
    result = subprocess.run([sys.executable, "-m", "engramd", "status", "--socket", stopped_daemon.endpoint, *args],
                            capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert result.returncode == EXIT_UNREACHABLE, result.stderr
    assert waited_s(result.stderr) >= at_least  # it really waited that long (0.5 s on the old code)


def test_a_slow_answer_within_the_default_is_taken(stopped_daemon):
    proc = subprocess.Popen([sys.executable, "-m", "engramd", "status", "--socket", stopped_daemon.endpoint],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3.0)  # the daemon answers 3 s late: well within the 10 s a probe counts on
        stopped_daemon.proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, err
    assert "ready" in out


def test_a_bad_timeout_is_one_error_line():
    result = subprocess.run([sys.executable, "-m", "engramd", "status", "--timeout", "0"], capture_output=True,
                            text=True, timeout=PROCESS_TIMEOUT_S)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error: ")] == \
        ["error: --timeout must be positive, got 0.0"]


# --wait W is a deadline: each request waits up to --timeout, but none past W.  On the old code the
# first request took the whole --timeout (30 s here) whatever W said.
@pytest.mark.parametrize("where", ["missing", "stopped"])
def test_status_wait_is_a_deadline_no_request_outlives(request, socket_dir, where):
    endpoint = (f"ipc://{socket_dir}/nobody.sock" if where == "missing"
                else request.getfixturevalue("stopped_daemon").endpoint)
    result = subprocess.run([sys.executable, "-m", "engramd", "status", "--socket", endpoint, "--wait", "1",
                             "--timeout", "30"], capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert result.returncode == EXIT_UNREACHABLE, result.stderr
    waited = float(re.search(r"(?:waited|within) ([0-9.]+) s", result.stderr).group(1))
    assert 1.0 <= waited < 30.0, result.stderr


# One validator (cli/reach.py: wait_option) for each command that waits: reload once took -5 as "no wait".
@pytest.mark.parametrize("command", ["status", "reload"])
def test_a_negative_wait_is_a_usage_error(command):
    result = subprocess.run([sys.executable, "-m", "engramd", command, "--wait", "-5"], capture_output=True,
                            text=True, timeout=PROCESS_TIMEOUT_S)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Invalid value for '--wait': -5.0 is not in the range x>=0" in lines[0], result.stderr


def test_status_wait_sees_a_daemon_restarted_after_kill_9_once_it_is_ready(daemon_factory):
    first = daemon_factory("--lease-seconds", "1.5")
    first.wait_state("ready")
    first.kill(signal.SIGKILL)  # leaves its socket file: the status below asks a socket nothing listens on
    probe = subprocess.Popen([sys.executable, "-m", "engramd", "status", "--socket", first.endpoint, "--wait", "120",
                              "--timeout", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)  # the probe's first request is waiting on the stale socket
        second = daemon_factory("--lease-seconds", "1.5")  # the same socket and shm dir: it re-adopts the table
        second.wait_state("ready")
        # The old request waited its whole --timeout (60 s) on the dead daemon; now the replaced
        # socket file ends it and the next poll asks the new daemon.
        out, err = probe.communicate(timeout=20)
    finally:
        end_process(probe)
    assert probe.returncode == 0, err
    assert out.startswith("state       ready") and "re-adopted" in out
