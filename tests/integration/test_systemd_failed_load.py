"""A failed first load under systemd's Type=notify: the process ends, saying why, instead of never
sending READY=1.  Over a real NOTIFY_SOCKET (a datagram socket the test reads, as systemd would)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from engramd.reporting.notify import EXIT_LOAD_FAILED
from engramd.synth.writer import write_checkpoint

PROCESS_TIMEOUT_S = 60


def test_a_failed_first_load_under_notify_exits_with_its_status_and_says_why(socket_dir, shm_dir, tmp_path):
    checkpoint = tmp_path / "ckpt"
    write_checkpoint(str(checkpoint), vocab_size=300)
    (checkpoint / "config.json").write_text("{ not json")  # the load fails; serve's start checks pass
    notify_path = os.path.join(socket_dir, "notify")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(notify_path)
    listener.settimeout(1.0)
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    proc = subprocess.Popen([sys.executable, "-m", "engramd", "serve", "--checkpoint", str(checkpoint),
                             "--socket", endpoint, "--shm-dir", shm_dir, "--no-progress"],
                            env=dict(os.environ, NOTIFY_SOCKET=notify_path), stderr=subprocess.PIPE, text=True)
    messages = []
    try:
        deadline = time.monotonic() + PROCESS_TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:  # the old code never exited
            try:
                messages.append(listener.recv(4096).decode())
            except socket.timeout:
                pass
        assert proc.poll() is not None, f"still running {PROCESS_TIMEOUT_S} s after its load failed: {messages}"
        stderr = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        listener.close()
    assert proc.returncode == EXIT_LOAD_FAILED, stderr
    assert not any("READY=1" in m for m in messages), messages
    failed = [m for m in messages if m.startswith("STATUS=load failed:")]
    assert failed and "config.json" in failed[0], messages
    assert any("STOPPING=1" in m and "load failed" in m for m in messages), messages  # the last word says why
    assert f"exiting with status {EXIT_LOAD_FAILED}" in stderr and "config.json" in stderr, stderr
    assert "Traceback" not in stderr, stderr
    assert sorted(os.listdir(socket_dir)) == ["notify"] and os.listdir(shm_dir) == []  # nothing left behind


def test_without_systemd_a_failed_load_stays_up_to_be_asked(daemon_factory, tmp_path):
    checkpoint = tmp_path / "ckpt"
    write_checkpoint(str(checkpoint), vocab_size=300)
    (checkpoint / "config.json").write_text("{ not json")
    daemon = daemon_factory("--checkpoint", str(checkpoint))
    status = daemon.wait_state("failed")
    assert "config.json" in status["error"] and daemon.proc.poll() is None
