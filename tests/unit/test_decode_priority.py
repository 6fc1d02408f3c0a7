"""Decode workers at SCHED_FIFO: while a budget's prefill crew takes every prefill-size job, a pool
asked for it (GatherPool(decode_priority=N), the client's decode_priority="fifo") runs its workers at
SCHED_FIFO N, where the process may; never while they may take a prefill-size job; and such a pool's
decode-size jobs leave the group's decode stamp alone, so quiet spares do not stand aside for them.

Real pools on real sealed budget memfds in this process (those that need SCHED_FIFO skip where it
may not), their threads' policies read from the kernel; the refusal as a real second user is
tests/integration/test_decode_priority_user.py.  No timing asserts.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from engram_client.core import budget_file
from engram_client.lookup.host import _host_gather
from proc_stats import may_run_fifo
from test_decode_cpus import open_budget
from test_host_gather import gather, gather_threads

ROWS, ROW_BYTES = 1 << 16, 264
PREFILL, DECODE = budget_file.SMALL_ROWS + 16384, 6144
TWO_CPUS = len(os.sched_getaffinity(0)) >= 2
pytestmark = pytest.mark.skipif(not TWO_CPUS, reason="needs two CPUs to keep one for decode")


needs_fifo = pytest.mark.skipif(not may_run_fifo(), reason="this process may not run threads at SCHED_FIFO")


def worker_policies(before: set[int]) -> set[int]:
    return {os.sched_getscheduler(tid) for tid in gather_threads("engram-gather") - before}


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (ROWS, ROW_BYTES), dtype=np.uint8)


def gathers_exactly(pool, table: np.ndarray, rows: int, seed: int) -> None:
    ids = np.random.default_rng(seed).integers(0, ROWS, rows).astype(np.int64)
    out, bad, _ = gather(pool, table, ids, row_hi=ROWS)
    assert bad == 0
    np.testing.assert_array_equal(out, table[ids])


@needs_fifo
def test_workers_run_at_sched_fifo_while_the_crew_takes_prefill_and_leave_the_decode_stamp_alone(table):
    before = gather_threads("engram-gather")
    budget = open_budget(2, decode=1, flags=budget_file.FLAG_SPARES_QUIET)
    pool = _host_gather.GatherPool(2, caller_gathers=False, budget=budget, cpus=[0, 1], decode_priority=1)
    try:
        assert pool.decode_priority == (1, 0) and pool.prefill_crew == (1, 0)
        assert worker_policies(before) == {os.SCHED_FIFO}
        assert {os.sched_getparam(tid).sched_priority for tid in gather_threads("engram-gather") - before} == {1}
        assert {os.sched_getscheduler(t) for t in gather_threads("engram-prefill")} == {os.SCHED_OTHER}
        gathers_exactly(pool, table, PREFILL, 1)  # the crew's
        gathers_exactly(pool, table, DECODE, 2)   # the workers'
        assert any(entry[3] for entry in budget.grant_log())  # the decode-size job gathered on a token
        # The spares of every rank need not stand aside for a decode call that takes their CPU at once.
        assert budget.group_state()["decode_at"] == 0
    finally:
        pool.close()


def test_a_pool_not_asked_or_without_a_crew_keeps_its_workers_at_normal_priority_and_stamps_its_decode(table):
    for decode, asked in ((1, 0), (0, 1)):  # a crew but not asked; asked but no decode CPUs, so no crew
        before = gather_threads("engram-gather")
        budget = open_budget(2, decode=decode, flags=budget_file.FLAG_SPARES_QUIET)
        pool = _host_gather.GatherPool(2, caller_gathers=False, budget=budget, cpus=[0, 1], decode_priority=asked)
        try:
            assert pool.decode_priority == (0, 0), (decode, asked)
            assert worker_policies(before) == {os.SCHED_OTHER}
            gathers_exactly(pool, table, DECODE, 3)
            assert budget.group_state()["decode_at"] > 0, (decode, asked)
        finally:
            pool.close()


@needs_fifo
def test_a_pool_moved_to_a_budget_where_its_workers_take_prefill_puts_them_back_at_normal_priority(table):
    before = gather_threads("engram-gather")
    pool = _host_gather.GatherPool(2, caller_gathers=False, budget=open_budget(2, decode=1), cpus=[0, 1],
                                   decode_priority=1)
    try:
        assert pool.decode_priority == (1, 0)
        assert pool.set_budget(open_budget(2))  # no decode CPUs: the crew stays, unused; the workers prefill
        assert pool.decode_priority == (0, 0) and worker_policies(before) == {os.SCHED_OTHER}
        gathers_exactly(pool, table, PREFILL, 4)
        assert pool.set_budget(open_budget(2, flags=budget_file.FLAG_PREFILL_IDLE))  # an idle crew takes prefill
        assert pool.decode_priority == (1, 0) and worker_policies(before) == {os.SCHED_FIFO}
        assert pool.set_budget(open_budget(2, decode=1))
        assert pool.decode_priority == (1, 0) and worker_policies(before) == {os.SCHED_FIFO}
        gathers_exactly(pool, table, DECODE, 5)
    finally:
        pool.close()


def test_a_priority_beyond_sched_fifo_is_refused_by_name():
    for bad in (-1, os.sched_get_priority_max(os.SCHED_FIFO) + 1):
        with pytest.raises(ValueError, match="decode_priority must be 0"):
            _host_gather.GatherPool(1, budget=open_budget(2, decode=1), cpus=[0, 1], decode_priority=bad)


@needs_fifo
def test_a_heartbeat_report_carries_the_workers_priority_only_to_a_daemon_that_knows_it():
    from engram_client.lookup.host.gather_seat import GatherSeat
    from engramd.daemon.gather_budget import client_report

    seat = GatherSeat(2, "words", budget=open_budget(2, decode=1), cpus=[0, 1])
    pool = seat.open_pool(realtime=True)
    try:
        assert "decode_fifo" not in seat.report((1, 9))
        report = seat.report((1, 10))
        assert report["decode_fifo"] == pool.decode_priority[0] == 1
        assert client_report(report) == report  # a 1.10 daemon takes it
    finally:
        pool.close()
