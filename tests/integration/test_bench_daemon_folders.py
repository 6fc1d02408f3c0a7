"""The benchmarks' daemon leaves no folder behind.

engram_client.tools.bench.start_daemon makes a folder for the daemon's socket under the temporary
directory and one for its table under /dev/shm; stop_daemon removes both once the daemon has exited.
Every benchmark run on a machine left two empty folders before.  A real daemon on its embedded demo
table, in real folders.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess

import pytest

from engram_client.attach.connection import DaemonConnection
from engram_client.attach.readiness import wait_ready
from engram_client.tools.bench import start_daemon, stop_daemon
from waiting import end_process

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="start_daemon puts its table under /dev/shm")


def ended(proc) -> None:
    """The daemon of a failed test stopped, and its folders gone with it."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
    end_process(proc)
    for folder in getattr(proc, "made_folders", ()):
        shutil.rmtree(folder, ignore_errors=True)


def test_stop_daemon_removes_the_folders_start_daemon_made():
    proc, endpoint, shm_dir = start_daemon(0.002, 1)
    try:
        socket_dir = os.path.dirname(endpoint[len("ipc://"):])
        wait_ready(DaemonConnection(endpoint), 120.0, daemon=proc)
        assert any(name.endswith(".table") for name in os.listdir(shm_dir)), os.listdir(shm_dir)
        assert os.path.exists(endpoint[len("ipc://"):])
        stop_daemon(proc, timeout_s=60)
        assert proc.returncode is not None
        assert not os.path.exists(shm_dir), os.listdir(shm_dir)
        assert not os.path.exists(socket_dir), os.listdir(socket_dir)
    finally:
        ended(proc)


def test_a_daemon_that_does_not_stop_in_time_keeps_its_folders():
    proc, endpoint, shm_dir = start_daemon(0.002, 1)
    try:
        socket_dir = os.path.dirname(endpoint[len("ipc://"):])
        wait_ready(DaemonConnection(endpoint), 120.0, daemon=proc)
        os.kill(proc.pid, signal.SIGSTOP)  # a stopped daemon holds the SIGTERM: still running when the wait ends
        with pytest.raises(subprocess.TimeoutExpired):
            stop_daemon(proc, timeout_s=0.5)
        assert os.path.isdir(shm_dir) and os.path.isdir(socket_dir)
        os.kill(proc.pid, signal.SIGCONT)  # the SIGTERM it holds now stops it
        stop_daemon(proc, timeout_s=60)
        assert not os.path.exists(shm_dir) and not os.path.exists(socket_dir)
    finally:
        ended(proc)
