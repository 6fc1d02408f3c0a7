"""A rank of its own on a budget the test holds, gathering fresh ids back to back until its stdin closes.

    python gathering_peer.py FD TOKENS SLOTS THREADS ROWS

It reopens the test's budget descriptor FD (inherited) through /proc/self/fd, as a rank reopens
the one the daemon hands it (its own open file description: its own locks), seats itself in
group 0 with TOKENS tokens of SLOTS slots, and gathers ROWS-row jobs of a 65,536-row table with a
pool of THREADS workers (a sample of each job's rows checked).  It prints its slot once its first job is done (a
slot is claimed at the first token), and at the end the longest gap between two of its jobs'
starts, in ms: a peer descheduled that long stopped looking like a rank that gathers back to back.
"""
from __future__ import annotations

import os
import select
import sys
import time

import numpy as np

from engram_client.lookup.host import _host_gather

TABLE_ROWS, ROW_BYTES = 1 << 16, 264
COMMAND = [sys.executable, os.path.abspath(__file__)]  # then FD TOKENS SLOTS THREADS ROWS


def reopened_budget(fd: int, tokens: int, slots: int = _host_gather.BUDGET_MAX_SLOTS):
    """A seat in group 0 of the budget behind ``fd``, through an open file description of this
    process's own (its locks), as a rank reopens the descriptor the daemon hands it."""
    own = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
    try:
        return _host_gather.NodeBudget(own, 0, tokens, slots)
    finally:
        os.close(own)


def main(fd: int, tokens: int, slots: int, threads: int, rows: int) -> None:
    budget = reopened_budget(fd, tokens, slots)
    pool = _host_gather.GatherPool(threads, caller_gathers=True, budget=budget)
    table = np.random.default_rng(1).integers(0, 256, (TABLE_ROWS, ROW_BYTES), dtype=np.uint8)
    out = np.empty((rows, ROW_BYTES), dtype=np.uint8)
    counter = np.zeros(1, dtype=np.int64)
    rng = np.random.default_rng()
    last, longest, announced = None, 0.0, False
    while not select.select([sys.stdin], [], [], 0)[0]:
        ids = rng.integers(0, TABLE_ROWS, rows)
        now = time.monotonic()
        longest = max(longest, now - last) if last is not None else 0.0
        last = now
        assert pool.gather(table.ctypes.data, 0, TABLE_ROWS, ROW_BYTES, ids.ctypes.data, True, ids.size,
                           out.ctypes.data, counter.ctypes.data) == 0
        np.testing.assert_array_equal(out[:64], table[ids[:64]])  # a sample: the loop stays a gather loop
        if not announced:
            print(budget.slot, flush=True)
            announced = True
    pool.close()
    print(f"{longest * 1000:.1f}", flush=True)


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:6]))
