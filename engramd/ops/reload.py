"""The reload operation: load the next generation beside the served one."""
from __future__ import annotations

from .args import arg


class Reload:
    """Load generation g+1 (from ``checkpoint``, under a reload root, or the same source) beside g."""
    name = "reload"

    def execute(self, daemon, args):
        return daemon.reload(arg(args, "checkpoint", (str, type(None)), default=None, max_len=4096))
