from __future__ import annotations


class Status:
    """The daemon's whole state; answering it is always possible, in every state."""
    name = "status"

    def execute(self, daemon, args):
        return daemon.status()
