"""The stop operation: the daemon stops once the reply is sent."""
from __future__ import annotations


class Stop:
    """Ask the daemon to stop once this reply is sent."""
    name = "stop"

    def execute(self, daemon, args, peer=None):
        daemon.request_stop()
        return {"stopping": True, "boot_id": daemon.boot_id}
