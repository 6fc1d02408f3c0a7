"""A start racing a stop on one socket: never two daemons on it.

The stopping daemon unlinks its lock file while it holds the lock, then lets go.  A
starter that opened the file just before could win the lock on that deleted file, and a
third start would then lock a fresh file and bind the same socket.  Real daemons; the
starter is held in that window by tests/support/lock_pause_site (the one thing no real timing
can do on purpose), everything else runs as it would.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from engram_client.attach.connection import DaemonConnection
from engram_client.tools.serve_process import launch_serve
from waiting import wait_for

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support", "lock_pause_site")


def _ready(connection: DaemonConnection) -> dict | None:
    try:
        status = connection.request("status", timeout=2)
    except Exception:
        return None
    return status if status["state"] == "ready" else None


def test_a_start_racing_a_stop_never_leaves_two_daemons(daemon_factory, socket_dir, shm_dir, tmp_path):
    first = daemon_factory()
    first.wait_state("ready")
    endpoint = first.endpoint
    gate = str(tmp_path / "gate")
    env = dict(os.environ, ENGRAMD_TEST_LOCK_GATE=gate,
               PYTHONPATH=os.pathsep.join(p for p in (SITE_DIR, os.environ.get("PYTHONPATH")) if p))
    other_shm = tempfile.mkdtemp(prefix="engt-", dir="/dev/shm")
    logs = {name: open(tmp_path / f"{name}.log", "wb") for name in ("second", "third")}
    second = third = None
    connection = DaemonConnection(endpoint)
    try:
        second = launch_serve(endpoint, shm_dir, log_level="info", output=logs["second"], env=env)
        wait_for(lambda: os.path.exists(gate + ".held"), "the second start to open the first's lock file", 60)
        stopped = subprocess.run([sys.executable, "-m", "engramd", "stop", "--socket", endpoint],
                                 capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert first.proc.wait(timeout=30) == 0
        open(gate + ".go", "w").close()  # the second now locks the file it opened, which is gone
        status = wait_for(lambda: _ready(connection), "the second daemon to serve", 60)
        assert status["pid"] == second.pid

        # A third start on the same socket (another shm dir, so only the socket's lock stands in its way).
        third = launch_serve(endpoint, other_shm, log_level="info", output=logs["third"])
        third_log = tmp_path / "third.log"
        wait_for(lambda: third.poll() is not None or "state -> ready" in third_log.read_text(),
                 "the third start to be refused or to serve", 60)
        assert third.poll() == 1, f"a third daemon serves the same socket:\n{third_log.read_text()}"
        assert f"another engramd (pid {second.pid}) is serving {endpoint}" in third_log.read_text()
        assert _ready(connection)["pid"] == second.pid
    finally:
        connection.close()
        for proc in (second, third):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
        for log in logs.values():
            log.close()
        shutil.rmtree(other_shm, ignore_errors=True)
