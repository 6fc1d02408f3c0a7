"""Who holds a daemon's lock file: its pid, written after the lock is taken, read by whoever is refused.

The lock itself is the flock; the pid beside it is only for the message a second
daemon prints ("pid 1234 holds it"), so a missing or unreadable pid is no error.
"""
from __future__ import annotations

import os


def write_pid(fd: int) -> None:
    """Replace the lock file's content with our pid (best effort: hugetlbfs has no write(2))."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass


def holder(path: str) -> str:
    """`` (pid N)`` for the process that wrote ``path``, or an empty string when it is unknown."""
    try:
        with open(path) as f:
            pid = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return ""
    return f" (pid {pid})"
