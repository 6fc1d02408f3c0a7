"""Waiting for a stopping daemon's process to be gone: which process, and for how long.

``engramd stop`` is done when the daemon's process has exited, not when it stops
answering: after its last answer a daemon still waits up to LOAD_STOP_S for a running
load to notice the stop, unlinks its tables, closes its sockets and lets go of its locks,
and a start meanwhile is refused naming it.

Which process: ``status`` reports the daemon's pid as its own pid namespace counts it (a
container's daemon may be pid 1 there).  The holder of the endpoint's lock file, as
/proc/locks shows it here, is that process counted in this namespace: that one is waited
for, through a pidfd opened before the stop is sent, so a later process that reuses the
number is never mistaken for it.  Where no holder is visible (a pid namespace this one
cannot see into), the lock file itself is watched until its lock is free, which the
daemon does last; where even that file cannot be opened, the socket file, which it
removes just before.
"""
from __future__ import annotations

import errno
import fcntl
import os
import select
import time

from ..guards.lock_owner import lock_holders_of, socket_lock_path

LOAD_STOP_S = 60.0  # how long a stopping daemon waits for its load thread (daemon/state_machine.py)
STOP_TIMEOUT_S = LOAD_STOP_S + 30.0  # engramd stop's default: that wait, then unlinking and exiting
POLL_S = 0.1


def _pid_gone(pid: int) -> bool:
    """Without a pidfd: no such process, or only its zombie (it has exited; its parent has not reaped it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return True


class DaemonExit:
    """What ``engramd stop`` watches to know the daemon at ``socket_path`` is gone; set up
    while the daemon still runs (before the stop is sent)."""

    def __init__(self, socket_path: str, reported_pid: int | None) -> None:
        self.socket_path = socket_path
        self.lock_path = socket_lock_path(socket_path)
        self.pid: int | None = None
        self._pidfd = self._lock_fd = -1
        try:
            holders = lock_holders_of(os.stat(self.lock_path))
        except OSError:
            holders = []
        if reported_pid in holders:
            self.pid = reported_pid
        elif len(holders) == 1:
            self.pid = holders[0]  # the same process, numbered in this pid namespace
        if self.pid is not None:
            try:
                self._pidfd = os.pidfd_open(self.pid)
            except (AttributeError, OSError):
                self._pidfd = -1  # an old kernel: fall back to /proc
            return
        try:
            self._lock_fd = os.open(self.lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            self._lock_fd = -1

    def describe(self) -> str:
        """What is watched, in words: the pid, or (unseen from here) the lock or the socket file."""
        if self.pid is not None:
            return f"pid {self.pid}"
        return f"its lock on {self.lock_path}" if self._lock_fd >= 0 else f"its socket file {self.socket_path}"

    def gone(self) -> str:
        """What was seen once the daemon is gone, in words."""
        return f"{self.describe()} {'released' if self.pid is None and self._lock_fd >= 0 else 'gone'}"

    def _gone(self) -> bool:
        if self.pid is not None:
            return _pid_gone(self.pid)
        if self._lock_fd >= 0:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return True
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return False
                raise
        return not os.path.lexists(self.socket_path)

    def wait(self, timeout: float) -> bool:
        """True once the daemon is gone, False if it is still there after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if self._pidfd >= 0:
                # A pidfd turns readable when its process exits, zombie or not.
                readable, _, _ = select.select([self._pidfd], [], [], max(0.0, remaining))
                return bool(readable)
            if self._gone():
                return True
            if remaining <= 0:
                return False
            time.sleep(min(POLL_S, remaining))

    def close(self) -> None:
        for fd in (self._pidfd, self._lock_fd):
            if fd >= 0:
                os.close(fd)
        self._pidfd = self._lock_fd = -1
