"""How many leases one peer and all peers together may hold, and how big a status gets.

One peer (a connection) holds one lease per client it runs, two for a moment while a
client moves to a new generation; nothing honest comes near PER_PEER.  TOTAL bounds the
daemon's memory whatever peers send.  Status lists at most STATUS_CLIENTS leases (the
oldest first) and counts all of them, so its reply stays far under any reply limit.
"""
from __future__ import annotations

from engram_client.core.errors import RequestError

PER_PEER = 16
TOTAL = 4096
STATUS_CLIENTS = 64  # leases listed in a status reply unless the request asks for another number
STATUS_CLIENTS_MAX = 1024
HOST_CHARS = 255  # a host name is at most 253 characters
DEVICE_CHARS = 64


class LeaseLimitError(RequestError):
    """A peer asked for more leases than it or the daemon may hold."""

    code = "too_many_leases"
