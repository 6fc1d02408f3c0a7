"""The status operation: the daemon's whole state, answered in every state."""
from __future__ import annotations


class Status:
    """The daemon's whole state; answering it is always possible, in every state."""
    name = "status"

    def execute(self, daemon, args):
        return daemon.status()
