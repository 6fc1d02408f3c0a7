"""Starting ``engramd serve`` as a child process: the one launcher the demo, the benchmarks and the tests use.

Torch-free; the caller owns the process and must stop it (``stop`` request, then wait).

Children run this interpreter with ``-P``: ``python -m engramd`` would otherwise put the
current directory first on ``sys.path``, and run from a clone's parent directory (which
holds the clone, ``engramd/``) or from any directory holding an ``engramd/`` or
``engram_client/`` folder, it would import that folder instead of the installed package.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO

# The interpreter and flags every child the tools start runs with: nothing from the cwd on sys.path.
CHILD_PYTHON = (sys.executable, "-P")


def serve_command(endpoint: str, shm_dir: str, *extra: str, log_level: str = "warning",
                  allow_disk: bool = False) -> list[str]:
    """The argv of ``engramd serve`` on ``endpoint`` with its table files in ``shm_dir``
    (``allow_disk``: a temporary directory where the machine has no /dev/shm)."""
    return [*CHILD_PYTHON, "-m", "engramd", "serve", "--socket", endpoint, "--shm-dir", shm_dir,
            "--no-progress", "--log-level", log_level, *(["--allow-disk"] if allow_disk else []), *extra]


def launch_serve(endpoint: str, shm_dir: str, *extra: str, log_level: str = "warning", allow_disk: bool = False,
                 output: IO | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start the daemon; its stdout and stderr go to ``output`` (default: inherited)."""
    return subprocess.Popen(serve_command(endpoint, shm_dir, *extra, log_level=log_level, allow_disk=allow_disk),
                            stdout=output, stderr=subprocess.STDOUT if output is not None else None, env=env)


def wait_for_socket(proc: subprocess.Popen, endpoint: str, timeout: float = 120.0) -> None:
    """Return once the daemon ``proc`` has bound its ``ipc://`` socket (it binds before it loads).

    A client refuses a missing socket file at once (no daemon there), so whoever starts a daemon
    and attaches right after waits for the file first; RuntimeError if the daemon exits or has not
    bound within ``timeout`` seconds."""
    path = endpoint[len("ipc://"):]
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise RuntimeError(f"engramd serve exited with code {proc.returncode} before binding {endpoint}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"engramd serve did not bind {endpoint} within {timeout:.0f} s")
        time.sleep(0.05)


def exit_on_sigterm() -> bool:
    """Make SIGTERM raise SystemExit in this process's main thread, so that a launcher's ``finally``
    stops the daemon it started: by default SIGTERM (what ``timeout`` and a job system send) ends the
    launcher at once, and its daemon goes on serving, its table in /dev/shm.  Only where SIGTERM has
    its default action and this is the main thread (a handler can be set nowhere else); True if set."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    return True
