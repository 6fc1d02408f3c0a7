"""The heartbeat operation: a rank renews its lease."""
from __future__ import annotations

from ...reporting.cache_report import cache_report
from ..gather_budget import client_report
from .args import arg


class Heartbeat:
    """Renew a lease (its id and secret); the reply carries boot_id and generation so clients notice a new daemon.
    A client on the gather budget also reports its counters (``budget``, protocol 1.3), and its HBM row cache
    its own (``cache``, 1.4)."""
    name = "heartbeat"

    def execute(self, daemon, args, peer=None):
        return daemon.heartbeat(arg(args, "client_id", str), arg(args, "secret", str, default="", max_len=64),
                                budget=client_report(args.get("budget")), cache=cache_report(args.get("cache")))
