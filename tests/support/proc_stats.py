"""What /proc says about a real process: its resident memory, its open descriptors and its threads'
scheduling policies; and whether this process may put a thread at SCHED_FIFO."""
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


def may_run_fifo() -> bool:
    """Whether this process may put a thread at SCHED_FIFO 1 (CAP_SYS_NICE, or a real-time priority limit)."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except PermissionError:
        return False
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    return True


def worker_policies(pid: int, name: str = "engram-gather") -> set[int]:
    """The scheduling policies of process ``pid``'s threads called ``name``."""
    policies = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                if f.read().strip() == name:
                    policies.add(os.sched_getscheduler(int(task)))
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended while we looked
            continue
    return policies
