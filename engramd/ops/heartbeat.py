"""The heartbeat operation: a rank renews its lease."""
from __future__ import annotations

from .args import arg


class Heartbeat:
    """Renew a lease; the reply carries boot_id and generation so clients notice a new daemon."""
    name = "heartbeat"

    def execute(self, daemon, args):
        return daemon.heartbeat(arg(args, "client_id", str))
