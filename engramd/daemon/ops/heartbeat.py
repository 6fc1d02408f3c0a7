"""The heartbeat operation: a rank renews its lease."""
from __future__ import annotations

from .args import arg


class Heartbeat:
    """Renew a lease (its id and secret); the reply carries boot_id and generation so clients notice a new daemon."""
    name = "heartbeat"

    def execute(self, daemon, args, peer=None):
        return daemon.heartbeat(arg(args, "client_id", str), arg(args, "secret", str, default="", max_len=64))
