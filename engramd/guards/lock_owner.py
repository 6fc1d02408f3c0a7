"""Who holds a daemon's lock file: its pid, written after the lock is taken, read by whoever is refused.

The lock itself is the flock; the pid beside it is only for the message a second
daemon prints ("pid 1234 holds it"), so a missing or unreadable pid is no error.
/proc/locks names the holders as this process's pid namespace sees them, which is how
``engramd stop`` finds the process it waits for (a pid the daemon reports about itself
may belong to another namespace).
"""
from __future__ import annotations

import errno
import fcntl
import os

SOCKET_LOCK_SUFFIX = ".lock"  # the flock beside an ipc socket: <socket path>.lock


def socket_lock_path(socket_path: str) -> str:
    return socket_path + SOCKET_LOCK_SUFFIX


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


def lock_holders_of(info: os.stat_result) -> list[int]:
    """Pids (as this process sees them) holding a lock on the file ``info`` describes; empty if unknown."""
    wanted = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    pids = []
    try:
        with open("/proc/locks") as locks:
            for line in locks:
                fields = line.split()
                if len(fields) >= 6 and fields[-3] == wanted and fields[-4].isdigit():
                    pids.append(int(fields[-4]))
    except OSError:
        return []
    return sorted(set(pid for pid in pids if pid > 0))  # 0: a holder this namespace cannot see


def lock_is_held(path: str) -> bool:
    """Whether some process holds a lock on the file at ``path`` (not followed); a file that is not
    a lock one can judge (a link, a FIFO, unreadable) counts as held: its owner's files are left alone."""
    try:
        # Never follow a planted link, nor block opening a FIFO planted under a lock's name.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)
    return False
