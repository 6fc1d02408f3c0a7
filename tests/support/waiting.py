"""Small helpers for tests that wait on real processes and sockets."""
from __future__ import annotations

import socket
import subprocess
import time


def wait_for(predicate, what: str, timeout: float = 30.0):
    """Poll ``predicate`` until it returns something truthy, and return that; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def free_port() -> int:
    """A loopback TCP port that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def end_process(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM ``proc`` if it still runs, SIGKILL it if it outlives ``grace`` seconds; reaped either way."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
