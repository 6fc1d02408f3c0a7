"""What a benchmark's JSON says of its run, under ``meta``: the command, the commit, the date and
the machine.  docs/BENCHMARKS.md's head is rendered from these files (benchmarks/report/), and a
figure without its machine and command cannot be compared with the next run's."""
from __future__ import annotations

import datetime
import os
import socket
import subprocess


def _commit() -> str | None:
    """The checkout's HEAD, where the package runs from one (None from an installed wheel)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        done = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _gpu() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def run_meta(command: str) -> dict:
    return {"command": command, "commit": _commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": {"gpu": _gpu(), "cpus": os.cpu_count(), "host": socket.gethostname()}}
