"""Byte counts as people read them: one rule for every message, log line and status field.

GiB from 1 GiB up, MiB from 1 MiB, KiB below that: a small table never shows as
"0.00 GiB", and a large one never as thousands of MiB.
"""
from __future__ import annotations

KIB, MIB, GIB = 2**10, 2**20, 2**30


def human_bytes(n: int | float) -> str:
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    if n >= MIB:
        return f"{n / MIB:.1f} MiB"
    if n >= KIB:
        return f"{n / KIB:.1f} KiB"
    return f"{int(n)} bytes"


def human_pair(done: int | float, total: int | float) -> str:
    """``done/total UNIT`` in the unit that suits the total (``12.0/38.1 MiB``)."""
    unit, scale = next(((u, s) for u, s in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)) if total >= s), ("bytes", 1))
    digits = 2 if unit == "GiB" else 1 if unit != "bytes" else 0
    return f"{done / scale:.{digits}f}/{total / scale:.{digits}f} {unit}"
