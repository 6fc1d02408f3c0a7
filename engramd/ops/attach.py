"""The attach operation: a rank asks for a lease on the served table."""
from __future__ import annotations

from engram_client.core.errors import ProtocolError

from .args import arg


class Attach:
    """Grant a lease on the ready table; the reply names the file to map."""
    name = "attach"

    def execute(self, daemon, args):
        pid = arg(args, "pid", int)
        if pid <= 0:
            raise ProtocolError(f"argument 'pid' must be positive, got {pid}")
        rank = arg(args, "rank", (int, type(None)), default=None)
        return daemon.attach(pid=pid, host=arg(args, "host", str, default=""), rank=rank,
                             device=arg(args, "device", str, default="cpu"))
