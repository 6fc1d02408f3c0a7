"""The status operation: the daemon's whole state, answered in every state."""
from __future__ import annotations

from engram_client.core.errors import ProtocolError

from ...guards.lease_limits import STATUS_CLIENTS, STATUS_CLIENTS_MAX
from .args import arg


class Status:
    """The daemon's whole state; answering it is always possible, in every state.

    ``clients`` lists at most ``clients_limit`` leases (default 64); ``clients_total`` counts all."""
    name = "status"

    def execute(self, daemon, args, peer=None):
        limit = arg(args, "clients_limit", int, default=STATUS_CLIENTS)
        if not 0 <= limit <= STATUS_CLIENTS_MAX:
            raise ProtocolError(f"argument 'clients_limit' must be 0..{STATUS_CLIENTS_MAX}, got {limit}")
        return daemon.status(clients_limit=limit)
