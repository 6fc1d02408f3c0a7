"""Handing the gather budget's descriptor to ranks on the ``.budget`` socket, bounded per user.

A descriptor sent over a unix socket stays queued in the peer's socket until the peer reads it or
closes, and the kernel counts each one queued so against the sender's user: past the sender's
RLIMIT_NOFILE, an unprivileged daemon can send none (``sendmsg`` fails with ETOOMANYREFS).
Closing our end takes nothing back.  So each connection is kept until its peer has read the
descriptor (what the socket still has unread, SIOCOUTQ, is 0) or has left, and the connections
still unread are counted per user (SO_PEERCRED):

    accept -> user at UNREAD_PER_USER, or UNREAD_TOTAL reached -> closed at once, nothing sent (logged)
           -> otherwise the descriptor is sent, and the connection kept until it is read or its peer leaves

The memory's mode is put back before each handout where it changed (a process of the daemon's
user may fchmod it, and a rank that cannot reopen it has no seat).

A rank reads its descriptor as soon as it has connected, so it is never among the unread long;
a peer that holds connections unread ties up at most UNREAD_PER_USER of the daemon's descriptors
and of its user's budget for descriptors in flight, and other users' ranks are served meanwhile.

Owns the connections it accepts; the listening socket and the budget memory are gather_budget.py's.
"""
from __future__ import annotations

import fcntl
import logging
import os
import socket
import stat
import struct
import termios
import threading
import time

log = logging.getLogger("engramd.gather_budget")
ACCEPT_POLL_S = 0.2
SEND_TIMEOUT_S = 1.0
UNREAD_PER_USER = 16  # handouts one user may leave unread at once (a rank reads its own within milliseconds)
UNREAD_TOTAL = 256    # ... and all users together: the daemon's descriptors these connections may hold
WARN_EVERY_S = 10.0   # each kind of warning a peer can cause is logged at most this often
_UCRED = struct.Struct("3i")  # pid, uid, gid


def peer_uid(conn: socket.socket) -> int:
    return _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))[1]


def unread_bytes(conn: socket.socket) -> int:
    """What this socket sent that its peer has not read yet (0 once read, or once the peer closed)."""
    return struct.unpack("i", fcntl.ioctl(conn.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]


class BudgetHandout:
    """The accept loop of the ``.budget`` socket, in a thread of its own (``serve``)."""

    def __init__(self, listener: socket.socket, budget_fd: int, closed: threading.Event):
        self.listener, self.fd, self.closed = listener, budget_fd, closed
        self.mode = stat.S_IMODE(os.fstat(budget_fd).st_mode)  # as created: what each rank reopens it by
        self.unread: dict[socket.socket, int] = {}  # connection -> its peer's uid
        self.refused = self.modes_restored = 0
        self._logged_at: dict[str, float] = {}  # kind of warning -> when last logged

    def serve(self) -> None:
        try:
            while not self.closed.is_set():
                self._forget_read()
                try:
                    conn, _ = self.listener.accept()
                except (TimeoutError, socket.timeout):
                    continue
                except OSError:
                    if self.closed.is_set():
                        return
                    continue
                self._hand_over(conn)
        finally:
            for conn in self.unread:
                conn.close()
            self.unread.clear()

    def _hand_over(self, conn: socket.socket) -> None:
        try:
            uid = peer_uid(conn)
        except OSError:
            conn.close()
            return
        held = sum(1 for owner in self.unread.values() if owner == uid)
        if held >= UNREAD_PER_USER or len(self.unread) >= UNREAD_TOTAL:
            conn.close()
            self._say_refused(uid, held)
            return
        try:
            self._restore_mode()
            conn.settimeout(SEND_TIMEOUT_S)
            socket.send_fds(conn, [b"B"], [self.fd])
        except OSError as exc:
            conn.close()
            self._warn("send", "could not hand the gather budget to a peer of uid %d: %s", uid, exc)
            return
        self.unread[conn] = uid

    def _restore_mode(self) -> None:
        mode = stat.S_IMODE(os.fstat(self.fd).st_mode)
        if mode != self.mode:
            os.fchmod(self.fd, self.mode)
            self.modes_restored += 1
            self._warn("mode", "the gather budget's memory had mode %o, not %o (a process of the daemon's user changed "
                       "it, and ranks could not reopen it): put back (%d times so far)", mode, self.mode,
                       self.modes_restored)

    def _forget_read(self) -> None:
        """Close the connections whose peer has read the descriptor or left."""
        for conn in [c for c in self.unread if _done(c)]:
            del self.unread[conn]
            conn.close()

    def _say_refused(self, uid: int, held: int) -> None:
        self.refused += 1
        self._warn("refused", "refused the gather budget to a peer of uid %d: %s (%d refused so far); its ranks "
                   "gather without the budget until it reads or closes them", uid,
                   f"it holds {held} handouts unread, the most one user may" if held >= UNREAD_PER_USER else
                   f"{len(self.unread)} handouts are unread, the most the daemon keeps", self.refused)

    def _warn(self, kind: str, *args) -> None:
        now = time.monotonic()
        if now - self._logged_at.get(kind, float("-inf")) >= WARN_EVERY_S:
            self._logged_at[kind] = now
            log.warning(*args)


def _done(conn: socket.socket) -> bool:
    try:
        return unread_bytes(conn) == 0
    except OSError:
        return True
