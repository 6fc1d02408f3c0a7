"""What /proc says about a real process: its resident memory and its open descriptors."""
from __future__ import annotations

import os


def _status_mib(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for pid {pid}")


def rss_mib(pid: int) -> float:
    """All resident memory, the table pages the daemon wrote or mapped included."""
    return _status_mib(pid, "VmRSS")


def heap_mib(pid: int) -> float:
    """Resident anonymous memory (RssAnon): what peers can make the daemon hold, without the
    table file's shared pages, which a load or reload adds."""
    return _status_mib(pid, "RssAnon")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))
