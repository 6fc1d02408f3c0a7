"""A daemon-only install: ``engramd serve``, ``status`` and ``stop`` run as real processes without torch."""
from __future__ import annotations

import os
import subprocess
import sys

from engram_client.tools.serve_process import launch_serve
from torchless import torchless_env

PROCESS_TIMEOUT_S = 60


def engramd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engramd", *args], env=torchless_env(), capture_output=True,
                          text=True, timeout=PROCESS_TIMEOUT_S)


def test_serve_status_stop_without_torch(socket_dir, shm_dir):
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    with open(os.path.join(socket_dir, "engramd.log"), "wb") as log:
        daemon = launch_serve(endpoint, shm_dir, log_level="info", output=log, env=torchless_env())
    try:
        status = engramd("status", "--socket", endpoint, "--wait", "30", "--json")
        assert status.returncode == 0, status.stderr
        assert '"state": "ready"' in status.stdout
        assert any(name.endswith(".table") for name in os.listdir(shm_dir))
        stopped = engramd("stop", "--socket", endpoint)
        assert stopped.returncode == 0, stopped.stderr
        assert "engramd stopped" in stopped.stdout
        assert daemon.wait(timeout=PROCESS_TIMEOUT_S) == 0
        assert not any(name.endswith(".table") for name in os.listdir(shm_dir))
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(timeout=10)
    with open(os.path.join(socket_dir, "engramd.log"), errors="replace") as f:
        assert "Traceback" not in f.read()
