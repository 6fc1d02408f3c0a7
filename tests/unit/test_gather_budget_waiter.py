"""A thread that waits for its gather on the node budget sleeps; it does not keep a core.

A synchronous gather's calling thread helps only on a token it can get at once; otherwise it waits
for its pool's workers.  It used to poll 100 us again after every 100 us nap, so it sat on a core
about half the time, outside the budget, beside the threads that held its tokens (0.46 s of CPU
over this test's one-second wait).  Now it polls once per chunk and sleeps until a block
completes the chunk, looking for a free token to help on every NB_WAITER_NAP_NS (0.03 s).

Real sealed budget memfd and a real pool; the one token is held by a second open file description
of the budget (what a peer that holds it does), so the pool's workers wait NB_STARVE_NS (1 s)
before they gather without it, and the calling thread waits all that time.  Its CPU time is
measured over the call: what it burns, not how fast anything runs.
"""
from __future__ import annotations

import os
import time

import numpy as np

from engram_client.core import budget_file
from engram_client.lookup.host import _host_gather
from test_host_gather import gather

ROWS, ROW_BYTES, CALL = 1 << 14, 264, 16384


def test_a_waiting_caller_sleeps_while_another_holds_the_tokens():
    fd = budget_file.create([1])
    holder = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)  # its own open file description: a peer's lock
    try:
        assert budget_file.lock_token(holder, 0, 0)
        budget = _host_gather.NodeBudget(fd, 0, 1, budget_file.MAX_SLOTS)
        pool = _host_gather.GatherPool(2, budget=budget)
        try:
            table = np.random.default_rng(0).integers(0, 256, (ROWS, ROW_BYTES), dtype=np.uint8)
            ids = np.random.default_rng(1).integers(0, ROWS, CALL).astype(np.int64)
            wall, cpu = time.monotonic(), time.thread_time()
            out, bad, _ = gather(pool, table, ids, row_hi=ROWS, row_bytes=ROW_BYTES)
            cpu, wall = time.thread_time() - cpu, time.monotonic() - wall
            assert bad == 0
            np.testing.assert_array_equal(out, table[ids])
            assert budget.stats()["overdraft"] >= 1, budget.stats()  # the workers waited for the token first
            assert wall >= 0.9, wall  # so the caller waited about a second for them
            assert cpu < 0.2 * wall, f"the waiting caller used {cpu:.3f} s of CPU in {wall:.3f} s"
        finally:
            pool.close()
    finally:
        os.close(holder)
        os.close(fd)
