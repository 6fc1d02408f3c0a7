"""A heartbeat's ``cache`` counters (protocol 1.4): what a client's HBM row cache did, totals over its layers.

    {"hits": int, "misses": int, "fetched": int, "bytes": int, "fixed_rows": int, "recent_rows": int}

hits and misses count lookups of rows (a hit is served from HBM, a miss from host memory),
fetched the rows moved from host memory, bytes the cache's HBM, fixed_rows and recent_rows
the rows its fixed part (the served hot-row list) and its recency part hold now.  All zeros
when the client's cache is off.  Checked as the ``budget`` counters are (engramd/daemon/gather_budget.py):
known names only, ints in [0, 2**63); anything else is a ProtocolError reply, never kept.
"""
from __future__ import annotations

from engram_client.core.errors import ProtocolError

CACHE_FIELDS = ("hits", "misses", "fetched", "bytes", "fixed_rows", "recent_rows")


def cache_report(value) -> dict | None:
    """The heartbeat's ``cache`` map, checked (None if absent)."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > len(CACHE_FIELDS):
        raise ProtocolError("argument 'cache' must be a map of the cache counters: " + ", ".join(CACHE_FIELDS))
    report = {}
    for name, item in value.items():
        if name not in CACHE_FIELDS:
            raise ProtocolError(f"argument 'cache' has an unknown field {str(name)[:32]!r}; known: "
                                + ", ".join(CACHE_FIELDS))
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < 2**63:
            raise ProtocolError(f"cache field {name!r} must be an integer between 0 and 2**63, got {str(item)[:32]}")
        report[name] = item
    return report
