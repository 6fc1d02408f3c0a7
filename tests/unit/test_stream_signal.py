"""The stream-signal protocol between gather workers and a stream, on the CPU (engine/signal.c).

The suite's machines have no GPU, so a Python thread plays the stream with a SignalTestSlot (a
signalled slot in plain memory): it writes ARMED into the slot's word as cuStreamWriteValue32
would, waits for the word to reach each chunk as cuStreamWaitValue32 (GEQ, cyclic) would, and
reads that chunk's rows from staging at that moment, so a chunk published before all its rows
were staged would show.  Rows are compared byte for byte with numpy's indexing.  Cases that end
a process (fork, exit) run in subprocesses.  tests/gpu/test_host_path_gpu.py runs the same path
with a real stream."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from engram_client import NotAttachedError
from engram_client.lookup.host import _host_gather
from engram_client.lookup.host.host_lookup import IDS_IN_PLACE, IDS_ON_HOST, open_pool

ROWS, ROW_BYTES, ARMED, IDLE = 5000, 264, 0, 0xFFFFFFFF
WAIT_S = 30.0


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (ROWS, ROW_BYTES), dtype=np.uint8)


class SimulatedStream:
    """What the CUDA stream does with one signalled slot, played on the CPU."""

    def __init__(self, slot, capacity: int):
        self.slot = slot
        self.word = np.ctypeslib.as_array((ctypes.c_uint32 * 1).from_address(slot.word_address))
        self.staging = np.ctypeslib.as_array(
            (ctypes.c_uint8 * (capacity * ROW_BYTES)).from_address(slot.staging_address)).reshape(capacity, ROW_BYTES)

    def reached(self, value: int) -> bool:
        return (int(self.word[0]) - value) & 0xFFFFFFFF < 0x80000000  # GEQ, cyclic as the driver compares

    def wait_chunk(self, chunk: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while not self.reached(chunk + 1):
            if time.monotonic() > deadline:
                raise AssertionError(f"the workers did not stage chunk {chunk} of {self.slot.nchunks} within {WAIT_S} s "
                                     f"(word {int(self.word[0]):#x})")
            time.sleep(0)

    def prepare_host_ids(self, table: np.ndarray, ids: np.ndarray, counter: np.ndarray, chunks: int = 4) -> int:
        """An eager call's prepare with int32 host ids over the whole table (as an enqueue's first part)."""
        return self.slot.prepare(table.ctypes.data, 0, ROWS, ids.ctypes.data, IDS_ON_HOST, False, ids.size,
                                 counter.ctypes.data, chunks)

    def run(self, n: int, arm: bool = True) -> np.ndarray:
        """One run as the stream sees it: arm, then each chunk's rows read as soon as its wait passes."""
        if arm:
            self.word[0] = ARMED
        rows = np.empty((n, ROW_BYTES), dtype=np.uint8)
        step = self.slot.chunk_rows
        for chunk in range(self.slot.nchunks):
            self.wait_chunk(chunk)
            rows[chunk * step:(chunk + 1) * step] = self.staging[chunk * step:min(n, (chunk + 1) * step)]
        return rows


def wait_until(condition, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout} s waiting for {what}")
        time.sleep(0.001)


@pytest.mark.parametrize("threads, chunks", [(1, 1), (3, 4), (8, 8)])
@pytest.mark.parametrize("id_dtype", [np.int32, np.int64])
def test_a_replayed_slot_stages_every_chunk_before_the_stream_copies_it(table, threads, chunks, id_dtype):
    pool = open_pool(threads, signalled=True)
    try:
        assert (pool.threads, pool.caller_gathers) == (threads, False)
        for n in (1, 33, 6144):
            slot = _host_gather.SignalTestSlot(pool, n, ROW_BYTES, graph=True)
            stream = SimulatedStream(slot, n)
            ids = np.zeros(n, dtype=id_dtype)  # a graph's input buffer: read in place at every replay
            counter = np.zeros(1, dtype=np.int64)
            assert slot.prepare(table.ctypes.data, 0, ROWS, ids.ctypes.data, IDS_IN_PLACE, id_dtype == np.int64, n,
                                counter.ctypes.data, chunks) == 0
            assert int(stream.word[0]) == IDLE and 1 <= slot.nchunks <= chunks
            rng = np.random.default_rng(n)
            for replay in range(25):  # back to back: a replay arms the word as the last run's workers leave
                ids[:] = rng.integers(0, ROWS, n)
                np.testing.assert_array_equal(stream.run(n), table[ids])
            assert counter[0] == 0
    finally:
        pool.close()


@pytest.mark.parametrize("chunks", [1, 4])
def test_a_worker_descheduled_in_its_publish_until_the_next_replay_is_armed_publishes_nothing_into_it(table, chunks):
    """The race the back-to-back replays above once lost under load: a worker of the last run, off
    its CPU between reading the word and advancing it, runs again after the stream has passed its
    last wait and armed the next replay.  ARMED is no word of its run, so it leaves it alone, and
    the replay, claimed once that run ends, stages its own rows (publish_late plays that worker in
    this thread, deterministically)."""
    pool = open_pool(4, signalled=True)
    try:
        n = 6144
        slot = _host_gather.SignalTestSlot(pool, n, ROW_BYTES, graph=True)
        stream = SimulatedStream(slot, n)
        ids = np.random.default_rng(11).integers(0, ROWS, n).astype(np.int64)
        counter = np.zeros(1, dtype=np.int64)
        assert slot.prepare(table.ctypes.data, 0, ROWS, ids.ctypes.data, IDS_IN_PLACE, True, n,
                            counter.ctypes.data, chunks) == 0
        np.testing.assert_array_equal(stream.run(n), table[ids])
        wait_until(lambda: slot.active == 0, "the run's last worker to leave it")
        ids[:] = np.random.default_rng(12).integers(0, ROWS, n)  # the next replay's ids
        assert slot.publish_late() == ARMED  # the last run's chunks were not published into the replay
        np.testing.assert_array_equal(stream.run(n, arm=False), table[ids])
    finally:
        pool.close()


def test_out_of_range_ids_of_a_replay_are_zeroed_and_counted_without_a_host_check(table):
    pool = open_pool(4, signalled=True)
    try:
        lo, hi = 1000, 3000
        slot = _host_gather.SignalTestSlot(pool, 400, ROW_BYTES, graph=True)
        stream = SimulatedStream(slot, 400)
        ids = np.array([1000, 999, 2999, 3000, -1, 2**62, -2**62, 1500] * 50, dtype=np.int64)
        counter = np.zeros(1, dtype=np.int64)
        slot.prepare(table[lo:hi].ctypes.data, lo, hi, ids.ctypes.data, IDS_IN_PLACE, True, ids.size,
                     counter.ctypes.data, 4)
        for replay in range(3):
            rows = stream.run(ids.size)
            valid = (ids >= lo) & (ids < hi)
            np.testing.assert_array_equal(rows[valid], table[ids[valid]])
            assert not rows[~valid].any()
            wait_until(lambda: counter[0] == 250 * (replay + 1), "the out-of-range count of the replay")
    finally:
        pool.close()


def test_an_eager_run_starts_at_once_or_when_armed_and_frees_its_slot_at_its_end(table):
    pool = open_pool(3, signalled=True)
    try:
        slot = _host_gather.SignalTestSlot(pool, 6144, ROW_BYTES)
        stream = SimulatedStream(slot, 6144)
        counter = np.zeros(1, dtype=np.int64)
        rng = np.random.default_rng(7)
        for call in range(12):
            ids = rng.integers(0, ROWS, 6144).astype(np.int32)
            assert stream.prepare_host_ids(table, ids, counter) == 0
            assert slot.in_flight == 1
            with pytest.raises(Exception, match="still in use by an earlier lookup"):
                stream.prepare_host_ids(table, ids, counter)
            now = call % 2 == 0
            if now:
                slot.start_now()  # host ids, staging free: no ARMED from the stream
            ids_copy = ids.copy()
            ids[:] = -1  # host ids were copied at prepare: the caller may reuse its buffer
            np.testing.assert_array_equal(stream.run(6144, arm=not now), table[ids_copy])
            wait_until(lambda: slot.in_flight == 0 and not slot.active, "the run's end to free the slot")
        bad = np.array([0, ROWS, -4], dtype=np.int64)
        assert slot.prepare(table.ctypes.data, 0, ROWS, bad.ctypes.data, IDS_ON_HOST, True, 3, counter.ctypes.data,
                            1) == 2
        assert slot.in_flight == 0, "a call refused for its host ids starts nothing"
    finally:
        pool.close()


@pytest.mark.parametrize("hold_us", [0, 300, 3000])
def test_an_eager_start_beside_a_pollers_lost_claim_still_ends_its_run_and_frees_its_slot(table, hold_us):
    """A poller that read ARMED with `active` 0 just before the last run was claimed holds `active`
    for a moment and lets go once it finds the word no longer ARMED (signal_try_claim).  An eager
    start beside it takes `active` only once it is 0: had it stored 1 over the borrow, the let-go
    would clear the new run's, whose end would then be skipped and the slot stay in flight for good."""
    pool = open_pool(3, signalled=True)
    try:
        slot = _host_gather.SignalTestSlot(pool, 6144, ROW_BYTES)
        stream = SimulatedStream(slot, 6144)
        counter = np.zeros(1, dtype=np.int64)
        rng = np.random.default_rng(hold_us)
        for call in range(5):
            ids = rng.integers(0, ROWS, 6144).astype(np.int32)
            assert stream.prepare_host_ids(table, ids, counter) == 0
            slot.start_now_beside_a_borrow(hold_us)
            np.testing.assert_array_equal(stream.run(6144, arm=False), table[ids])
            wait_until(lambda: slot.in_flight == 0 and not slot.active, "the run's end to free the slot", 10)
    finally:
        pool.close()


def test_many_slots_of_several_pools_armed_at_once_are_all_answered(table):
    pools = [open_pool(t, signalled=True) for t in (1, 2, 5)]
    failures: list[BaseException] = []

    def stream_thread(pool, seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            slots = [_host_gather.SignalTestSlot(pool, 3000, ROW_BYTES, graph=True) for _ in range(6)]
            streams = [SimulatedStream(s, 3000) for s in slots]
            inputs = [np.zeros(3000, dtype=np.int64) for _ in slots]
            counter = np.zeros(1, dtype=np.int64)
            for slot, ids in zip(slots, inputs):
                slot.prepare(table.ctypes.data, 0, ROWS, ids.ctypes.data, IDS_IN_PLACE, True, 3000,
                             counter.ctypes.data, 3)
            for step in range(6):
                for ids in inputs:
                    ids[:] = rng.integers(0, ROWS, 3000)
                for stream in streams:
                    stream.word[0] = ARMED  # every slot armed before any is waited for
                for ids, stream in zip(inputs, streams):
                    np.testing.assert_array_equal(stream.run(3000, arm=False), table[ids])
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=stream_thread, args=(p, i)) for i, p in enumerate(pools * 2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not failures, failures
    finally:
        for p in pools:
            p.close()


def test_after_close_a_replay_is_still_answered_and_a_disarmed_one_reads_nothing(table):
    before = thread_names()
    pool = open_pool(4, signalled=True)
    slot = _host_gather.SignalTestSlot(pool, 2000, ROW_BYTES, graph=True)
    stream = SimulatedStream(slot, 2000)
    ids = np.random.default_rng(3).integers(0, ROWS, 2000)
    counter = np.zeros(1, dtype=np.int64)
    slot.prepare(table.ctypes.data, 0, ROWS, ids.ctypes.data, IDS_IN_PLACE, True, 2000, counter.ctypes.data, 4)
    np.testing.assert_array_equal(stream.run(2000), table[ids])
    pool.close()
    assert pool.closed and thread_names().count("engram-gather") == before.count("engram-gather")
    with pytest.raises(NotAttachedError, match="gather pool is closed"):
        _host_gather.SignalTestSlot(pool, 10, ROW_BYTES)
    # A graph captured before close may replay after it: one process-wide thread answers.
    np.testing.assert_array_equal(stream.run(2000), table[ids])
    assert "engram-signals" in thread_names()
    slot.disarm()  # the client's close: the table is about to be unmapped
    assert not stream.run(2000).any()
    wait_until(lambda: counter[0] == 0 and slot.bad == 2000, "the disarmed run's zeroed rows to be counted")


def test_idle_workers_sleep_once_the_spin_window_and_the_expected_replays_have_passed(table):
    saved = _host_gather.get_signal_tuning()
    _host_gather.set_signal_tuning(1_000_000, 20_000, 1_000_000)  # spin 1 ms after the last job
    pool = open_pool(4, signalled=True)
    try:
        stream, ids, _counter = in_place_graph_slot(pool, table)
        for _ in range(6):  # a steady period (5 ms), as decode replays: the watcher learns to expect more
            stream.run(500)
            time.sleep(0.005)
        time.sleep(0.1)  # more than four periods without a replay: the prediction has ended
        # Every worker, the watcher included, is seen asleep (state S) in some of 200 samples: a
        # thread spinning on the words would always be running.
        gather_tids, seen_asleep = gather_threads_seen_asleep(200)
        assert len(gather_tids) >= 4 and gather_tids <= seen_asleep
        np.testing.assert_array_equal(stream.run(500), table[ids])  # and a napping watcher still answers
    finally:
        pool.close()
        _host_gather.set_signal_tuning(*saved)
    with pytest.raises(ValueError, match="signal watching"):
        _host_gather.set_signal_tuning(-1, 20_000, 1_000_000)


@pytest.mark.parametrize("on_budget", [True, False])
def test_on_the_node_budget_the_watcher_naps_after_a_job_where_a_pool_alone_spins(table, on_budget):
    """The budget counts only threads that gather on its tokens, so a budgeted pool's watcher does not
    spin after a job (pool.h, pool_spin_room): every gather thread is seen asleep well inside the spin
    window, and the napping watcher still answers.  A pool alone (the control) keeps one spinning."""
    from engram_client.core import budget_file

    saved = _host_gather.get_signal_tuning()
    _host_gather.set_signal_tuning(5_000_000_000, 20_000, 1_000_000)  # spin 5 s after the last job
    fd = budget_file.create([2])
    try:
        budget = _host_gather.NodeBudget(fd, 0, 2, budget_file.MAX_SLOTS) if on_budget else None
        pool = _host_gather.GatherPool(2, caller_gathers=False, budget=budget)
        try:
            stream, ids, _counter = in_place_graph_slot(pool, table)
            np.testing.assert_array_equal(stream.run(500), table[ids])  # one job: no period to predict
            time.sleep(0.05)
            gather_tids, seen_asleep = gather_threads_seen_asleep(100)  # 0.2 s or more, inside the 5 s window
            assert len(gather_tids) == 2
            if on_budget:
                assert gather_tids <= seen_asleep
            else:
                assert len(gather_tids - seen_asleep) == 1, "a pool alone keeps its watcher spinning after a job"
            np.testing.assert_array_equal(stream.run(500), table[ids])
        finally:
            pool.close()
    finally:
        os.close(fd)
        _host_gather.set_signal_tuning(*saved)


def in_place_graph_slot(pool, table: np.ndarray, n: int = 500):
    """A graph slot of ``pool`` whose int64 ids 0 .. n-1 stay in place, in two chunks: its stream,
    its ids and its out-of-range counter (keep both alive: the slot holds their addresses)."""
    slot = _host_gather.SignalTestSlot(pool, n, ROW_BYTES, graph=True)
    ids = np.arange(n, dtype=np.int64)
    counter = np.zeros(1, dtype=np.int64)
    slot.prepare(table.ctypes.data, 0, ROWS, ids.ctypes.data, IDS_IN_PLACE, True, n, counter.ctypes.data, 2)
    return SimulatedStream(slot, n), ids, counter


def gather_threads_seen_asleep(samples: int) -> tuple[set, set]:
    """The pool's gather threads, and those seen asleep (state S) in some of ``samples`` looks 2 ms apart."""
    seen_asleep = set()
    for _ in range(samples):
        seen_asleep |= {tid for tid, name, state in thread_states() if name == "engram-gather" and state == "S"}
        time.sleep(0.002)
    return {tid for tid, name, _ in thread_states() if name == "engram-gather"}, seen_asleep


def thread_states() -> list[tuple[str, str, str]]:
    """(tid, name, state) of this process's threads, from /proc."""
    out = []
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            with open(f"/proc/{os.getpid()}/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:  # a thread that ended while we looked
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        out.append((tid, name, stat[stat.rindex(")") + 2]))
    return out


def thread_names() -> list[str]:
    return [name for _, name, _ in thread_states()]


CHILD = textwrap.dedent("""
    import ctypes, os, sys, time, numpy as np
    from engram_client import NotAttachedError
    from engram_client.lookup.host import _host_gather
    from engram_client.lookup.host.host_lookup import open_pool
    table = np.arange(264 * 100, dtype=np.int64).astype(np.uint8).reshape(100, 264)
    pool = open_pool(3, signalled=True)
    slot = _host_gather.SignalTestSlot(pool, 100, 264, graph=True)
    word = np.ctypeslib.as_array((ctypes.c_uint32 * 1).from_address(slot.word_address))
    staging = np.ctypeslib.as_array((ctypes.c_uint8 * (100 * 264)).from_address(slot.staging_address))
    ids = np.arange(100, dtype=np.int64)[::-1].copy()
    slot.prepare(table.ctypes.data, 0, 100, ids.ctypes.data, 2, True, 100, 0, 1)

    def replay():
        word[0] = 0
        deadline = time.monotonic() + 30
        while word[0] != 1:
            assert time.monotonic() < deadline, "no answer to a replay"
        return (staging.reshape(100, 264) == table[ids]).all()

    assert replay()
    pid = os.fork()
    if pid == 0:
        try:
            slot.prepare(table.ctypes.data, 0, 100, ids.ctypes.data, 2, True, 100, 0, 1)
            os._exit(3)
        except NotAttachedError as exc:
            os._exit(0 if "forked child must create its own client" in str(exc) and pool.closed else 4)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    print("parent still answered", replay())
    if sys.argv[1] == "close":
        pool.close()
        print("janitor answered", replay())
    # exit with the watcher (or the janitor) polling a registered word: must not hang or crash
""")


@pytest.mark.parametrize("ending", ["close", "leave-open"])
def test_fork_refuses_the_parents_signals_and_exit_with_watched_words_is_clean(ending):
    result = subprocess.run([sys.executable, "-c", CHILD, ending], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "parent still answered True" in result.stdout
    assert ending != "close" or "janitor answered True" in result.stdout


def test_a_pool_on_the_node_budget_answers_replayed_slots_too(table):
    """Workers that gather only on budget tokens must still watch the signals and publish each chunk:
    a replayed slot on a budgeted pool is staged exactly, every replay (a real sealed budget memfd)."""
    from engram_client.core import budget_file

    fd = budget_file.create([2])
    try:
        budget = _host_gather.NodeBudget(fd, 0, 2, budget_file.MAX_SLOTS)
        pool = _host_gather.GatherPool(2, caller_gathers=False, budget=budget)
        try:
            assert pool.budgeted and not pool.caller_gathers
            n = 6144
            slot = _host_gather.SignalTestSlot(pool, n, ROW_BYTES, graph=True)
            stream = SimulatedStream(slot, n)
            ids = np.zeros(n, dtype=np.int64)
            counter = np.zeros(1, dtype=np.int64)
            assert slot.prepare(table.ctypes.data, 0, ROWS, ids.ctypes.data, IDS_IN_PLACE, True, n,
                                counter.ctypes.data, 4) == 0
            rng = np.random.default_rng(7)
            for _ in range(10):
                ids[:] = rng.integers(0, ROWS, n)
                np.testing.assert_array_equal(stream.run(n), table[ids])
        finally:
            pool.close()
    finally:
        os.close(fd)
