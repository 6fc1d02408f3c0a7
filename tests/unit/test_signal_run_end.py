"""A signalled run ends once, when its last worker leaves it (job_leave, engine/pool.c).

On the H200 machine, eight rank processes of 15 gather threads each on 16 CPUs raised "this
staging slot is still in use by an earlier lookup" for a slot whose in_flight the Python side
had just read as free: the count had gone below zero, because two workers ended one run.  A
worker that found the job with blocks left (under the pool's lock) counted itself in after the
last worker had left it, took no block, and left as a second last worker.  Here the test hook
set_join_pause holds every worker for a while between finding a job and joining it, so workers
join late all the time; a Python thread plays the stream of one eager slot (SignalTestSlot), run
after run, and the slot's count of runs in flight must be exactly 0 after every run and every
run's rows exact.  Before the fix, the count went negative within the first runs of every try.
"""
from __future__ import annotations

import numpy as np
import pytest

from engram_client.lookup.host import _host_gather
from engram_client.lookup.host.host_lookup import open_pool
from test_stream_signal import ROW_BYTES, ROWS, SimulatedStream, table, wait_until  # noqa: F401 (table: a fixture)

RUNS, JOIN_PAUSE_NS = 150, 100_000


@pytest.fixture
def late_joiners():
    _host_gather.set_join_pause(JOIN_PAUSE_NS)
    yield
    _host_gather.set_join_pause(0)


def test_each_run_ends_once_though_workers_join_as_its_last_worker_leaves(table, late_joiners):
    pool = open_pool(8, signalled=True)
    try:
        slot = _host_gather.SignalTestSlot(pool, 6144, ROW_BYTES)
        stream = SimulatedStream(slot, 6144)
        counter = np.zeros(1, dtype=np.int64)
        rng = np.random.default_rng(1)
        for run in range(RUNS):
            n = int(rng.integers(64, 6145))  # from two blocks to 192: some runs end while joiners wait
            ids = rng.integers(0, ROWS, n).astype(np.int32)
            assert stream.prepare_host_ids(table, ids, counter) == 0
            np.testing.assert_array_equal(stream.run(n), table[ids])
            wait_until(lambda: slot.in_flight <= 0 and not slot.active, f"the end of run {run}")
            assert slot.in_flight == 0, f"run {run} was ended {1 - slot.in_flight} times"
        assert counter[0] == 0
    finally:
        pool.close()
