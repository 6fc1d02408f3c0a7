"""The reload operation: load the next generation beside the served one."""
from __future__ import annotations

from engram_client.core.errors import ProtocolError

from .args import arg


class Reload:
    """Load generation g+1 (from ``checkpoint``, under a reload root, or the same source) beside g."""
    name = "reload"

    def execute(self, daemon, args, peer=None):
        checkpoint = arg(args, "checkpoint", (str, type(None)), default=None, max_len=4096)
        if checkpoint is not None and "\0" in checkpoint:
            raise ProtocolError("argument 'checkpoint' contains a NUL character; no path can")
        return daemon.reload(checkpoint)
