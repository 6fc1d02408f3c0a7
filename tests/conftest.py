"""Shared fixtures: real daemons in subprocesses, on temporary ipc sockets and shm dirs."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

import numpy as np
import pytest

import engram_client
from engram_client.attach.connection import DaemonConnection
from engram_client.core.errors import EngramError
from engram_client.tools.serve_process import launch_serve
from budget_ranks import Ranks
from waiting import end_process

# The processes the tests start as scripts (tests/support/ranks/*.py) have their own folder first on
# sys.path, not the working directory, so they would import whichever engram_client is installed: a
# checkout tested beside an editable install of another tree would run the other tree's code in its
# peers.  The tree this process imported goes first on their PYTHONPATH.
TREE_UNDER_TEST = os.path.dirname(os.path.dirname(os.path.abspath(engram_client.__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (TREE_UNDER_TEST, os.environ.get("PYTHONPATH")) if p)


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
        self.extra = extra
        self.log_path = os.path.join(socket_dir, f"{name}.log")
        self.proc: subprocess.Popen | None = None
        self.connection = DaemonConnection(self.endpoint)

    def start(self) -> "DaemonProcess":
        self._log = open(self.log_path, "ab")
        self.proc = launch_serve(self.endpoint, self.shm_dir, *self.extra, log_level="info", output=self._log)
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
        if self.proc is not None:
            end_process(self.proc)
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
def budget_daemon(daemon_factory):
    """A ready daemon with a gather budget on the CPUs named (and any more arguments)."""
    def start(cpus: str, *more: str):
        daemon = daemon_factory("--lease-seconds", "1.5", "--gather-cpus", cpus, *more)
        daemon.wait_state("ready")
        return daemon
    return start


@pytest.fixture
def ranks():
    """Rank processes of tests/support/ranks/budget_rank.py, killed at the end if a test left them running."""
    started: list[Ranks] = []

    def start(endpoint, specs) -> Ranks:
        started.append(Ranks(endpoint, specs))
        return started[-1]
    yield start
    for r in started:
        r.close()


@pytest.fixture
def demo_daemon(daemon_factory):
    """A ready daemon on the embedded demo table, with a short lease for expiry tests."""
    daemon = daemon_factory("--lease-seconds", "1.5")
    daemon.wait_state("ready")
    return daemon


SPECIAL_SCALES = [0, 1, 2, 63, 100, 126, 127, 128, 129, 200, 253, 254, 255]


def write_special_checkpoint(directory: str) -> tuple[np.ndarray, np.ndarray]:
    """A one-layer checkpoint whose rows hold every E4M3 byte (NaNs and subnormals too)
    against every awkward UE8M0 scale (0 = 2^-127, 254 = 2^127 which overflows, 255 = NaN).
    Written with the safetensors library; returns (weight, scale) as uint8 arrays."""
    import json

    import torch
    from safetensors.torch import save_file

    rows, head_dim = 307, 256  # 307 is the smallest prime >= the vocab size 300
    weight = ((np.arange(head_dim)[None, :] + np.arange(rows)[:, None]) % 256).astype(np.uint8)
    flat = np.arange(rows * head_dim // 32)
    scale = np.array(SPECIAL_SCALES, dtype=np.uint8)[(flat * 5 + flat // 13) % len(SPECIAL_SCALES)]
    scale = scale.reshape(rows, head_dim // 32)
    os.makedirs(directory, exist_ok=True)
    config = {"engram_layer_ids": [3], "engram_num_embeddings": rows, "engram_max_ngram_size": 2,
              "engram_n_heads": 1, "engram_head_dim": head_dim, "engram_vocab_size": 300}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    save_file({"layers.3.engram.embed.weight": torch.from_numpy(weight).view(torch.float8_e4m3fn),
               "layers.3.engram.embed.scale": torch.from_numpy(scale).view(torch.float8_e8m0fnu)},
              os.path.join(directory, "model.safetensors"))
    return weight, scale


@pytest.fixture
def special_daemon(daemon_factory, tmp_path):
    """A ready daemon serving the special-values checkpoint; returns (daemon, weight, scale)."""
    weight, scale = write_special_checkpoint(str(tmp_path / "special"))
    daemon = daemon_factory("--checkpoint", str(tmp_path / "special"))
    daemon.wait_state("ready")
    return daemon, weight, scale
