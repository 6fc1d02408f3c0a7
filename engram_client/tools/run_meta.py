"""What a benchmark's JSON says of its run, under ``meta``: the command, the commit, the date and
the machine.  docs/BENCHMARKS.md's head is rendered from these files (benchmarks/report/), and a
figure without its machine and command cannot be compared with the next run's."""
from __future__ import annotations

import datetime
import os
import socket
import subprocess


def _commit() -> str | None:
    """The checkout's HEAD, short, with ``+changes`` where tracked files differ from it (a copy of a
    work tree on another machine); None from an installed wheel or without git."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0 or not head.stdout.strip():
        return None
    return head.stdout.strip() + ("+changes" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def _gpu() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def run_meta(command: str, gpu: str | None = None) -> dict:
    """``meta`` of a run of ``command``; ``gpu`` where the caller knows it (else torch is asked)."""
    return {"command": command, "commit": _commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
            "machine": {"gpu": gpu or _gpu(), "cpus": os.cpu_count(), "host": socket.gethostname()}}
