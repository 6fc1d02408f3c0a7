"""A lease renewed while its rank is still attaching.

The daemon grants a lease in its attach reply, and the rank's heartbeat thread starts once the
rank is ready to look rows up: after it has mapped the table, registered it with CUDA, verified
it through the GPU and warmed its lookup path.  Registration alone costs about 0.06 s per GiB on
the H200 machine (docs/history/benchmarks-2026-11.md, "Attach"), so a rank attaching DeepSeek-V4.1's 188.8 GiB
takes longer than the default 10 s lease, and so did eight ranks attaching a 32 GiB table at once
there: every lease expired before its first heartbeat, and each rank had to attach again.  While
the attach work runs, this keeper renews the lease from the reply at the heartbeat's interval;
the rank's heartbeat thread takes over when it is done (and a lease the daemon no longer knows
is re-attached there, at its first beat).  A refresh keeps its new generation's lease the same way.
"""
from __future__ import annotations

import threading
from typing import Any

from ..core.errors import EngramError


def heartbeat_interval(lease_seconds: float) -> float:
    """How often a lease is renewed: three times a lease, and at most five times a second."""
    return max(0.2, float(lease_seconds) / 3)


class LeaseKeeper:
    """``with LeaseKeeper(connection, reply):`` renews ``reply``'s lease until the block ends."""

    def __init__(self, connection, reply: dict[str, Any]):
        self._connection = connection
        self._args = {"client_id": reply["client_id"], "secret": reply.get("lease_secret", "")}
        self.interval = heartbeat_interval(reply["lease_seconds"])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engram-client-attach-lease", daemon=True)

    def __enter__(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        # A renewal in progress ends within its own timeout (the interval): wait a little longer.
        self._thread.join(timeout=self.interval + 1.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._connection.request("heartbeat", self._args, timeout=self.interval)
            except EngramError:  # the daemon is gone or dropped the lease: the heartbeat thread, once started,
                pass             # finds out at its first beat, re-attaches and says so
