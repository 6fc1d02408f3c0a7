"""How many leases one connection, one process, one user and all peers together may hold,
and how big a status gets.

One connection holds one lease per client it runs, two for a moment while a client moves
to a new generation; nothing honest comes near PER_PEER.  A process (a rank) runs one client,
a few at most; PER_PROCESS stops one process from opening connection after connection until
it holds every lease.  PER_USER keeps, whatever one local user's processes do, at least
TOTAL - PER_USER leases for the ranks of other users.  Process and user are the kernel's
word (SO_PEERCRED on the ipc connection), never the ``pid`` a client writes in ``attach``; a
peer in a pid namespace the daemon cannot see is counted by connection and user only.
TOTAL bounds the daemon's memory whatever peers send.  Status lists at most
STATUS_CLIENTS leases (the oldest first) and counts all of them, so its reply stays far
under any reply limit.
"""
from __future__ import annotations

from dataclasses import dataclass

from engram_client.core.errors import RequestError

PER_PEER = 16
PER_PROCESS = 64
PER_USER = 1024
TOTAL = 4096
STATUS_CLIENTS = 64  # leases listed in a status reply unless the request asks for another number
STATUS_CLIENTS_MAX = 1024
HOST_CHARS = 255  # a host name is at most 253 characters
DEVICE_CHARS = 64


@dataclass(frozen=True)
class Holder:
    """Whom a lease is counted against: the connection that asked, and the process and user
    behind it as the kernel told (None where it did not)."""

    connection: bytes = b""
    pid: int | None = None
    uid: int | None = None


class LeaseLimitError(RequestError):
    """A peer asked for more leases than it or the daemon may hold."""

    code = "too_many_leases"
