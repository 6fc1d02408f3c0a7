"""The detach operation: a rank gives its lease back."""
from __future__ import annotations

from .args import arg


class Detach:
    """Release a lease at once (a clean client exit); only its holder, who knows its secret, can."""
    name = "detach"

    def execute(self, daemon, args, peer=None):
        return daemon.detach(arg(args, "client_id", str), arg(args, "secret", str, default="", max_len=64))
