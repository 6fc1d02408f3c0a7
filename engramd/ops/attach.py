"""The attach operation: a rank asks for a lease on the served table."""
from __future__ import annotations

from engram_client.core.errors import ProtocolError

from ..lease_limits import DEVICE_CHARS, HOST_CHARS
from .args import arg


class Attach:
    """Grant a lease on the ready table; the reply names the file to map and the lease's secret."""
    name = "attach"

    def execute(self, daemon, args, peer: bytes = b""):
        pid = arg(args, "pid", int)
        if pid <= 0:
            raise ProtocolError(f"argument 'pid' must be positive, got {pid}")
        rank = arg(args, "rank", (int, type(None)), default=None)
        return daemon.attach(pid=pid, host=arg(args, "host", str, default="", max_len=HOST_CHARS), rank=rank,
                             device=arg(args, "device", str, default="cpu", max_len=DEVICE_CHARS), peer=peer)
