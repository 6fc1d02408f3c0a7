"""Shared fixtures: real daemons in subprocesses, on temporary ipc sockets and shm dirs."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from engram_client.connection import DaemonConnection
from engram_client.errors import EngramError


def pytest_collection_modifyitems(config, items):
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class DaemonProcess:
    """``engramd serve`` as a real process; every wait is bounded."""

    def __init__(self, socket_dir: str, shm_dir: str, *extra: str, name: str = "engramd"):
        self.endpoint = f"ipc://{socket_dir}/{name}.sock"
        self.shm_dir = shm_dir
        self.args = [sys.executable, "-m", "engramd", "serve", "--socket", self.endpoint, "--shm-dir", shm_dir,
                     "--no-progress", "--log-level", "info", *extra]
        self.log_path = os.path.join(socket_dir, f"{name}.log")
        self.proc: subprocess.Popen | None = None
        self.connection = DaemonConnection(self.endpoint)

    def start(self) -> "DaemonProcess":
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT)
        return self

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def status(self, timeout: float = 5.0) -> dict:
        return self.connection.request("status", timeout=timeout)

    def wait_state(self, *states: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"engramd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                last = self.status(timeout=1.0)
                if last["state"] in states:
                    return last
            except EngramError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"engramd did not reach {states} within {timeout} s (last {last}):\n{self.log()}")

    def table_files(self) -> list[str]:
        return sorted(name for name in os.listdir(self.shm_dir) if ".table" in name)

    def kill(self, sig: int = signal.SIGKILL) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.connection.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if hasattr(self, "_log"):
            self._log.close()


@pytest.fixture
def socket_dir():
    # ipc paths are limited to ~107 bytes, so sockets live in a short temp dir.
    path = tempfile.mkdtemp(prefix="engt-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def shm_dir():
    """A fresh directory in the real /dev/shm (tmpfs), removed afterwards."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = tempfile.mkdtemp(prefix="engt-", dir=base)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemon_factory(socket_dir, shm_dir):
    started: list[DaemonProcess] = []

    def start(*extra: str, name: str = "engramd", shm: str | None = None) -> DaemonProcess:
        daemon = DaemonProcess(socket_dir, shm or shm_dir, *extra, name=name).start()
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


@pytest.fixture
def demo_daemon(daemon_factory):
    """A ready daemon on the embedded demo table, with a short lease for expiry tests."""
    daemon = daemon_factory("--lease-seconds", "1.5")
    daemon.wait_state("ready")
    return daemon
