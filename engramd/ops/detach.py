"""The detach operation: a rank gives its lease back."""
from __future__ import annotations

from .args import arg


class Detach:
    """Release a lease at once (a clean client exit)."""
    name = "detach"

    def execute(self, daemon, args):
        return daemon.detach(arg(args, "client_id", str))
