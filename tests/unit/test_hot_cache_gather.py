"""The host gather's side of the HBM hot-row cache, on the CPU: ids the classify kernel marked as
hits (SKIP_ID) are neither read nor counted bad, and the pool counts hits, misses and rows fetched.

A Python thread plays the stream with a SignalTestSlot, as tests/unit/test_stream_signal.py does;
the ids are what the classify kernel writes (tests/gpu/test_hot_cache_gpu.py runs the kernels)."""
from __future__ import annotations

import numpy as np

from engram_client.lookup.host import _host_gather
from engram_client.lookup.cache.layer_caches import cache_report, layer_budgets
from engram_client.lookup.cache.row_cache import SKIP_ID
from engram_client.lookup.host.host_lookup import IDS_IN_PLACE, open_pool
from test_stream_signal import ROW_BYTES, ROWS, SimulatedStream, wait_until

SENTINEL = 0xA5


def test_marked_ids_are_skipped_counted_as_hits_and_leave_staging_untouched():
    table = np.random.default_rng(0).integers(0, 256, (ROWS, ROW_BYTES), dtype=np.uint8)
    pool = open_pool(3, signalled=True)
    try:
        n = 6144
        slot = _host_gather.SignalTestSlot(pool, n, ROW_BYTES, graph=True)
        stream = SimulatedStream(slot, n)
        ids = np.zeros(n, dtype=np.int64)
        counter = np.zeros(1, dtype=np.int64)
        assert slot.prepare(table.ctypes.data, 0, ROWS, ids.ctypes.data, IDS_IN_PLACE, True, n, counter.ctypes.data,
                            2, True) == 0
        rng = np.random.default_rng(1)
        expected_hits = expected_misses = expected_bad = 0
        for replay in range(4):
            wanted = rng.integers(0, ROWS, n)
            hit = rng.random(n) < 0.4
            bad = ~hit & (rng.random(n) < 0.05)
            ids[:] = np.where(hit, SKIP_ID, np.where(bad, -2, wanted))
            stream.staging[:] = SENTINEL
            rows = stream.run(n)
            fetched = ~hit & ~bad
            np.testing.assert_array_equal(rows[fetched], table[wanted[fetched]])
            assert (rows[hit] == SENTINEL).all(), "a hit's staging row was written"
            assert not rows[bad].any()
            expected_hits += int(hit.sum())
            expected_bad += int(bad.sum())
            expected_misses += int(fetched.sum())
            wait_until(lambda: counter[0] == expected_bad, "the out-of-range count of the replay")
        wait_until(lambda: pool.cache_counts == (expected_hits, expected_misses, expected_misses),
                   f"the pool's counts {pool.cache_counts} to reach {(expected_hits, expected_misses)}")
    finally:
        pool.close()


def test_without_the_mark_a_callers_minus_one_is_still_an_out_of_range_id():
    table = np.random.default_rng(2).integers(0, 256, (ROWS, ROW_BYTES), dtype=np.uint8)
    pool = open_pool(2, signalled=True)
    try:
        slot = _host_gather.SignalTestSlot(pool, 64, ROW_BYTES, graph=True)
        stream = SimulatedStream(slot, 64)
        ids = np.full(64, -1, dtype=np.int64)
        ids[::2] = 7
        counter = np.zeros(1, dtype=np.int64)
        slot.prepare(table.ctypes.data, 0, ROWS, ids.ctypes.data, IDS_IN_PLACE, True, 64, counter.ctypes.data, 1)
        rows = stream.run(64)
        assert not rows[1::2].any() and (rows[::2] == table[7]).all()
        wait_until(lambda: counter[0] == 32, "the 32 ids of -1 to be counted out of range")
        wait_until(lambda: pool.cache_counts == (0, 0, 32), "the pool to count 32 fetched rows and no cache use")
    finally:
        pool.close()


def test_a_cpu_gather_counts_its_rows_fetched():
    table = np.random.default_rng(3).integers(0, 256, (ROWS, ROW_BYTES), dtype=np.uint8)
    pool = open_pool(2)
    try:
        ids = np.array([1, 2, ROWS, 3], dtype=np.int64)
        out = np.empty((4, ROW_BYTES), dtype=np.uint8)
        assert pool.gather(table.ctypes.data, 0, ROWS, ROW_BYTES, ids.ctypes.data, True, 4, out.ctypes.data, 0) == 1
        assert pool.cache_counts == (0, 0, 3)
    finally:
        pool.close()


def test_the_budget_is_split_by_rows_and_the_report_sums_layers():
    assert layer_budgets(1000, {1: 300, 14: 100}) == {1: 750, 14: 250}

    class Described:
        def __init__(self, **fields):
            self.fields = fields

        def describe(self):
            return self.fields

    class Pool:
        cache_counts = (5, 7, 9)

    report = cache_report(Pool(), [Described(bytes=10, fixed_rows=1, recent_rows=8),
                                   Described(bytes=20, fixed_rows=0, recent_rows=16)])
    assert report == {"hits": 5, "misses": 7, "fetched": 9, "bytes": 30, "fixed_rows": 1, "recent_rows": 24}
    assert cache_report(None, [])["hits"] == 0
