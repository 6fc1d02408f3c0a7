"""The C row gather (engram_client.lookup.host._host_gather) on the CPU: exact bytes, bad ids, the pool's life.

Each gather is compared byte for byte with numpy's fancy indexing of the same table.  Life
cycle cases that end a process (fork, interpreter exit) run in subprocesses."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from engram_client import EngramError, NotAttachedError
from engram_client.lookup.host.host_lookup import count_outside, open_pool

ROWS, ROW_BYTES = 5000, 264


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (ROWS, ROW_BYTES), dtype=np.uint8)


def gather(pool, table: np.ndarray, ids: np.ndarray, row_lo: int = 0, row_hi: int = ROWS, row_bytes: int = ROW_BYTES):
    """(rows, bad, counter): the rows of ``ids`` from ``table`` viewed as rows [row_lo, row_hi)."""
    out = np.full((ids.size, row_bytes), 0xAB, dtype=np.uint8)
    counter = np.zeros(1, dtype=np.int64)
    bad = pool.gather(table.ctypes.data, row_lo, row_hi, row_bytes, ids.ctypes.data, ids.dtype == np.int64,
                      ids.size, out.ctypes.data, counter.ctypes.data)
    return out, bad, int(counter[0])


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("id_dtype", [np.int32, np.int64])
def test_gather_is_byte_exact_for_every_thread_count(table, threads, id_dtype):
    pool = open_pool(threads)
    try:
        assert pool.threads == threads
        rng = np.random.default_rng(threads)
        for n in (1, 31, 32, 33, 6144, 20000):  # around one block, several blocks, many blocks
            ids = rng.integers(0, ROWS, n).astype(id_dtype)
            ids[0] = ROWS - 1  # the last row ends exactly at the end of the table
            out, bad, counted = gather(pool, table, ids)
            assert (bad, counted) == (0, 0)
            np.testing.assert_array_equal(out, table[ids])
    finally:
        pool.close()


@pytest.mark.parametrize("id_dtype", [np.int32, np.int64])
def test_out_of_range_ids_are_never_read_their_rows_zeroed_and_counted(table, id_dtype):
    pool = open_pool(2)
    try:
        lo, hi = 1000, 3000  # a registered range: the table pointer is row 1000's
        ids = np.array([1000, 999, 2999, 3000, -1, np.iinfo(id_dtype).max, np.iinfo(id_dtype).min, 1500] * 40,
                       dtype=id_dtype)
        out, bad, counted = gather(pool, table[lo:hi], ids, lo, hi)
        valid = (ids >= lo) & (ids < hi)
        assert bad == counted == int((~valid).sum()) == 200
        np.testing.assert_array_equal(out[valid], table[ids[valid]])
        assert not out[~valid].any(), "a bad id's row must be zeros, not stale staging"
        assert count_outside(ids.ctypes.data, id_dtype == np.int64, ids.size, lo, hi) == 200
    finally:
        pool.close()


def test_other_row_sizes_and_an_empty_gather(table):
    pool = open_pool(2)
    try:
        flat = table.reshape(-1)[: 700 * 136].reshape(700, 136)  # a 128-wide head: 136-byte rows
        ids = np.random.default_rng(4).integers(0, 700, 3000)
        out, bad, _ = gather(pool, flat, ids, 0, 700, 136)
        assert bad == 0
        np.testing.assert_array_equal(out, flat[ids])
        out, bad, counted = gather(pool, table, np.zeros(0, dtype=np.int64))
        assert (out.shape, bad, counted) == ((0, ROW_BYTES), 0, 0)
    finally:
        pool.close()


def test_bad_arguments_raise_clearly(table):
    pool = open_pool(1)
    with pytest.raises(ValueError, match="gather_threads must be between 1 and 1024"):
        open_pool(0)
    with pytest.raises(ValueError, match="gather of -1 rows"):
        pool.gather(table.ctypes.data, 0, ROWS, ROW_BYTES, 0, True, -1, 0, 0)
    pool.close()
    with pytest.raises(NotAttachedError, match="gather pool is closed"):
        gather(pool, table, np.arange(4))
    assert issubclass(NotAttachedError, EngramError)


def test_close_is_idempotent_and_garbage_collection_joins_the_threads(table):
    # Judged by this pool's own threads: the ids of the gather threads that appeared with it (a
    # pool of another test, still alive in this process, may start or stop meanwhile).
    before = gather_threads()
    pool = open_pool(6)
    mine = gather_threads() - before
    assert len(mine) == 5  # the caller is the sixth gatherer
    gather(pool, table, np.arange(100))
    pool.close()
    pool.close()
    assert pool.closed and not mine & gather_threads()
    before = gather_threads()
    pool = open_pool(4)
    mine = gather_threads() - before
    assert len(mine) == 3
    del pool  # no close: deallocation stops and joins the workers
    assert not mine & gather_threads()


def gather_threads(name: str = "engram-gather") -> set[int]:
    """The pools' worker threads alive in this process (OS threads named ``name``), by id."""
    tids = set()
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            with open(f"/proc/{os.getpid()}/task/{task}/comm") as f:
                if f.read().strip() == name:
                    tids.add(int(task))
        except FileNotFoundError:  # a thread that ended while we looked
            pass
    return tids


CHILD = textwrap.dedent("""
    import os, sys, numpy as np
    from engram_client import NotAttachedError
    from engram_client.lookup.host.host_lookup import open_pool
    table = np.arange(264 * 100, dtype=np.int64).astype(np.uint8).reshape(100, 264)
    pool = open_pool(4)
    ids = np.arange(100, dtype=np.int64)
    out = np.zeros_like(table)
    assert pool.gather(table.ctypes.data, 0, 100, 264, ids.ctypes.data, True, 100, out.ctypes.data, 0) == 0
    pid = os.fork()
    if pid == 0:
        try:
            pool.gather(table.ctypes.data, 0, 100, 264, ids.ctypes.data, True, 100, out.ctypes.data, 0)
            os._exit(3)
        except NotAttachedError as exc:
            ok = "forked child must create its own client" in str(exc) and pool.closed
            fresh = open_pool(2)  # a child may start its own pool
            out2 = np.zeros_like(table)
            fresh.gather(table.ctypes.data, 0, 100, 264, ids.ctypes.data, True, 100, out2.ctypes.data, 0)
            os._exit(0 if ok and (out2 == table).all() else 4)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    assert pool.gather(table.ctypes.data, 0, 100, 264, ids.ctypes.data, True, 100, out.ctypes.data, 0) == 0
    print("parent still gathers", (out == table).all())
    if sys.argv[1] == "leave-open":
        sys.exit(0)  # interpreter exit with the pool's threads still asleep: must not hang
    pool.close()
""")


@pytest.mark.parametrize("ending", ["close", "leave-open"])
def test_a_forked_child_refuses_the_parents_pool_and_exit_never_hangs(ending):
    result = subprocess.run([sys.executable, "-c", CHILD, ending], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "parent still gathers True" in result.stdout
