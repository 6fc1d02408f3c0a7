"""``engramd stop`` returns once the daemon's process is gone, and says so when it is not.

A daemon that has answered ``stop`` can still run for a while (a load it waits for, or
here: systemd slow to read its notify socket).  The slow reader is real: the daemon's
NOTIFY_SOCKET is a datagram socket whose queue the test fills, so the daemon's last
notification (STOPPING=1, sent after it stopped answering requests) blocks until the
test reads.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from engram_client.tools.serve_process import launch_serve
from waiting import wait_for

PROCESS_TIMEOUT_S = 60


@pytest.fixture
def slow_systemd_daemon(socket_dir, shm_dir):
    """A ready daemon whose next sd_notify datagram blocks until ``drain()`` is called."""
    notify_path = os.path.join(socket_dir, "notify")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(notify_path)
    listener.settimeout(60)
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    log_path = os.path.join(socket_dir, "engramd.log")
    with open(log_path, "wb") as log:
        proc = launch_serve(endpoint, shm_dir, log_level="info", output=log,
                            env=dict(os.environ, NOTIFY_SOCKET=notify_path))
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        while "READY=1" not in listener.recv(4096).decode():
            pass
        filler.setblocking(False)
        while True:  # fill the queue systemd would read: the daemon's next send waits for room
            try:
                filler.sendto(b"X=1", notify_path)
            except BlockingIOError:
                break

        def drain() -> None:
            listener.setblocking(False)
            while True:
                try:
                    listener.recv(4096)
                except BlockingIOError:
                    return

        yield endpoint, proc, drain, lambda: open(log_path, errors="replace").read()
    finally:
        if proc.poll() is None:
            listener.close()  # the daemon's blocked send fails and it goes on
            proc.terminate()
            proc.wait(timeout=30)
        listener.close()
        filler.close()


def test_stop_that_times_out_says_the_daemon_still_runs(slow_systemd_daemon):
    endpoint, proc, drain, _ = slow_systemd_daemon
    result = subprocess.run([sys.executable, "-m", "engramd", "stop", "--socket", endpoint, "--timeout", "2"],
                            capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert proc.poll() is None  # the daemon is still there: a correct stop cannot have said "stopped"
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert f"pid {proc.pid}" in line and "still running" in line and "--timeout" in line, line
    drain()
    assert proc.wait(timeout=30) == 0


def test_stop_returns_only_once_the_process_is_gone(slow_systemd_daemon):
    endpoint, proc, drain, log = slow_systemd_daemon
    stop = subprocess.Popen([sys.executable, "-m", "engramd", "stop", "--socket", endpoint],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: "unlinked" in log(), "the daemon to have answered stop and unlinked its table", 30)
        time.sleep(2.0)  # the daemon is blocked for as long as the test does not read: give stop time to err
        assert stop.poll() is None, f"stop returned while pid {proc.pid} still ran: {stop.communicate()}"
        drain()
        out, err = stop.communicate(timeout=PROCESS_TIMEOUT_S)
        assert stop.returncode == 0, err
        assert "engramd stopped" in out and f"pid {proc.pid}" in out, out
        assert proc.poll() is not None  # gone by the time stop said so
    finally:
        if stop.poll() is None:
            stop.kill()
            stop.wait(timeout=30)
    assert proc.wait(timeout=30) == 0


def test_stop_from_another_pid_namespace_waits_for_the_daemons_lock(slow_systemd_daemon):
    """Where the daemon's pid cannot be seen (a real pid namespace of its own for the stop), stop
    waits until the daemon lets go of its socket's lock, the last thing it does."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    if subprocess.run(["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True, timeout=30).returncode:
        pytest.skip("cannot make a pid namespace here")
    endpoint, proc, drain, log = slow_systemd_daemon
    stop = subprocess.Popen(["unshare", "-p", "-f", "--mount-proc", sys.executable, "-m", "engramd", "stop",
                             "--socket", endpoint], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: "unlinked" in log(), "the daemon to have answered stop and unlinked its table", 30)
        time.sleep(2.0)  # the daemon is blocked for as long as the test does not read
        assert stop.poll() is None, f"stop returned while pid {proc.pid} still ran: {stop.communicate()}"
        drain()
        out, err = stop.communicate(timeout=PROCESS_TIMEOUT_S)
        assert stop.returncode == 0, err
        assert "engramd stopped (its lock on" in out and "released" in out, out
    finally:
        if stop.poll() is None:
            stop.kill()
            stop.wait(timeout=30)
    assert proc.wait(timeout=30) == 0
