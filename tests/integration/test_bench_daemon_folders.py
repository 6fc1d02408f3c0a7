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
from engram_client.core.endpoints import ipc_path
from engram_client.tools.bench import start_daemon, stop_daemon
from waiting import end_process

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="start_daemon puts its table under /dev/shm")


@pytest.fixture
def bench_daemon():
    """A daemon start_daemon started on a small demo table, serving: (proc, its socket, its table folder).
    After the test it is stopped whatever the test left it as (stopped by SIGSTOP included), and its
    folders go with it."""
    proc, endpoint, shm_dir = start_daemon(0.002, 1)
    try:
        wait_ready(DaemonConnection(endpoint), 120.0, daemon=proc)
        yield proc, ipc_path(endpoint), shm_dir
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        end_process(proc)
        for folder in proc.made_folders:
            shutil.rmtree(folder, ignore_errors=True)


def test_stop_daemon_removes_the_folders_start_daemon_made(bench_daemon):
    proc, socket_path, shm_dir = bench_daemon
    socket_dir = os.path.dirname(socket_path)
    assert any(name.endswith(".table") for name in os.listdir(shm_dir)), os.listdir(shm_dir)
    assert os.path.exists(socket_path), os.listdir(socket_dir)
    stop_daemon(proc, timeout_s=60)
    assert proc.returncode is not None
    assert not os.path.exists(shm_dir), os.listdir(shm_dir)
    assert not os.path.exists(socket_dir), os.listdir(socket_dir)


def test_a_daemon_that_does_not_stop_in_time_keeps_its_folders(bench_daemon):
    proc, socket_path, shm_dir = bench_daemon
    socket_dir = os.path.dirname(socket_path)
    os.kill(proc.pid, signal.SIGSTOP)  # a stopped daemon holds the SIGTERM: still running when the wait ends
    with pytest.raises(subprocess.TimeoutExpired):
        stop_daemon(proc, timeout_s=0.5)
    assert os.path.isdir(shm_dir) and os.path.isdir(socket_dir)
    os.kill(proc.pid, signal.SIGCONT)  # the SIGTERM it holds now stops it
    stop_daemon(proc, timeout_s=60)
    assert not os.path.exists(shm_dir) and not os.path.exists(socket_dir)
