"""engramd under systemd: the readiness protocol over a real NOTIFY_SOCKET, and the unit file."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

from engramd.synth.writer import write_checkpoint

UNIT = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "systemd", "engramd.service")


def test_ready_is_sent_only_once_the_table_is_ready(socket_dir, shm_dir, tmp_path):
    write_checkpoint(str(tmp_path / "ckpt"), vocab_size=3000, head_dim=256)
    notify_path = os.path.join(socket_dir, "notify")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(notify_path)
    listener.settimeout(60)
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    proc = subprocess.Popen([sys.executable, "-m", "engramd", "serve", "--checkpoint", str(tmp_path / "ckpt"),
                             "--socket", endpoint, "--shm-dir", shm_dir, "--no-progress", "--max-load-rate", "8"],
                            env=dict(os.environ, NOTIFY_SOCKET=notify_path), stderr=subprocess.DEVNULL)
    messages = []
    try:
        while not any("READY=1" in m for m in messages):
            messages.append(listener.recv(4096).decode())
        assert any(m.startswith("STATUS=loading:") for m in messages[:-1]), messages
        # a 38 MB table reads in MiB, never as "0.02 of 0.04 GiB"
        assert any(re.match(r"STATUS=loading: [0-9.]+/[0-9.]+ MiB \([0-9.]+%\)$", m) for m in messages), messages
        ready_at = next(i for i, m in enumerate(messages) if "READY=1" in m)
        status = subprocess.run([sys.executable, "-m", "engramd", "status", "--socket", endpoint, "--json"],
                                capture_output=True, timeout=60)
        assert status.returncode == 0  # by the time READY=1 was sent the table was served
        assert all("READY=1" not in m for m in messages[:ready_at])
        proc.terminate()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = listener.recv(4096).decode()
            if "STOPPING=1" in message:
                break
        else:
            pytest.fail("no STOPPING=1")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        listener.close()


def test_unit_file_verifies():
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    text = open(UNIT).read()
    assert "Type=notify" in text and "LimitMEMLOCK=infinity" in text and "RuntimeDirectory=engramd" in text
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", UNIT], capture_output=True, text=True,
                            timeout=60)
    # The unit names /usr/local/bin/engramd, which need not exist here: only that complaint is tolerated.
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if line.strip() and "/usr/local/bin/engramd" not in line and "engramd.service" in line]
    assert not problems, problems
    mount = os.path.join(os.path.dirname(UNIT), "dev-shm-engramd.mount")
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", mount], capture_output=True, text=True,
                            timeout=60)
    problems = [line for line in (result.stdout + result.stderr).splitlines() if "dev-shm-engramd.mount" in line]
    assert not problems, problems
