"""The prefill crew: where the node budget says --prefill-gathers idle, a pool gathers prefill-size
jobs on threads of its own at SCHED_IDLE, and decode-size jobs on its workers at normal priority.

Real sealed budget memfds and real pools in this process; which threads did a job's work is read
from each thread's CPU time in /proc (schedstat, in ns), and their policy from the kernel.  The
sandbox that refuses SCHED_IDLE is a real one too: a child process under a seccomp filter that
answers sched_setscheduler with EPERM.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from engram_client.core import budget_file
from engram_client.lookup.host import _host_gather
from test_host_gather import gather, gather_threads

ROWS, ROW_BYTES = 1 << 14, 264
PREFILL, DECODE = budget_file.SMALL_ROWS + 4096, 6144


def cpu_ns(tids: set[int]) -> int:
    total = 0
    for tid in tids:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total


@pytest.fixture
def table() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (ROWS, ROW_BYTES), dtype=np.uint8)


def open_budget(flags: int):
    fd = budget_file.create([3], flags=flags)
    try:
        return _host_gather.NodeBudget(fd, 0, 3, budget_file.MAX_SLOTS)
    finally:
        os.close(fd)


def asleep(tid: int) -> bool:
    """Whether the thread is blocked in the kernel (state S), not running nor waiting for a CPU (R)."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0] == "S"


def settle(tids: set[int] = frozenset()) -> None:
    """Until every thread of ``tids`` is asleep: workers linger 50 us after a job, and a crew thread
    beside busy threads may wait long for the CPU to finish doing so (bounded: 10 s).  Asleep is the
    kernel's word, twice 50 ms apart with no CPU time between: a thread kept off its CPU uses none
    for a while but is not asleep, and it would gather again once it ran."""
    time.sleep(0.05)
    deadline = time.monotonic() + 10
    while tids and time.monotonic() < deadline:
        before = cpu_ns(tids)
        if all(asleep(tid) for tid in tids):
            time.sleep(0.05)
            if cpu_ns(tids) == before and all(asleep(tid) for tid in tids):
                return
        time.sleep(0.01)
    assert not tids or time.monotonic() < deadline, "the pool's threads did not fall asleep within 10 s"


def test_a_budget_that_asks_gets_a_crew_at_sched_idle_and_its_workers_stay_normal(table):
    before_crew, before_workers = gather_threads("engram-prefill"), gather_threads()
    budget = open_budget(budget_file.FLAG_PREFILL_IDLE)
    assert budget.prefill_idle
    pool = _host_gather.GatherPool(3, budget=budget)
    try:
        crew, workers = gather_threads("engram-prefill") - before_crew, gather_threads() - before_workers
        assert pool.prefill_crew == (3, 0) and len(crew) == 3 and len(workers) == 2
        assert {os.sched_getscheduler(tid) for tid in crew} == {os.SCHED_IDLE}
        assert {os.sched_getscheduler(tid) for tid in workers} == {os.SCHED_OTHER}
    finally:
        pool.close()
    assert pool.prefill_crew == (0, 0) and not gather_threads("engram-prefill") - before_crew  # joined


def test_prefill_jobs_go_to_the_crew_and_decode_jobs_to_the_workers_byte_exact(table):
    before_crew, before_workers = gather_threads("engram-prefill"), gather_threads()
    pool = _host_gather.GatherPool(3, budget=open_budget(budget_file.FLAG_PREFILL_IDLE))
    try:
        crew, workers = gather_threads("engram-prefill") - before_crew, gather_threads() - before_workers
        rng = np.random.default_rng(1)
        settle()
        crew_before, caller_spent, caller_wall = cpu_ns(crew), 0, 0
        for _ in range(3):  # calls long enough that a call's fixed cost to its caller is a small part of it
            ids = rng.integers(0, ROWS, 8 * PREFILL).astype(np.int64)
            out = np.zeros((ids.size, ROW_BYTES), np.uint8)
            started, wall = time.thread_time_ns(), time.monotonic_ns()
            bad = pool.gather(table.ctypes.data, 0, ROWS, ROW_BYTES, ids.ctypes.data, True, ids.size, out.ctypes.data, 0)
            caller_spent += time.thread_time_ns() - started
            caller_wall += time.monotonic_ns() - wall
            assert bad == 0
            np.testing.assert_array_equal(out, table[ids])
        crew_spent = cpu_ns(crew) - crew_before
        assert crew_spent > 0, "the crew gathered nothing of three prefill-size jobs"
        settle(crew | workers)
        crew_before, workers_before = cpu_ns(crew), cpu_ns(workers)
        for _ in range(20):
            ids = rng.integers(0, ROWS, DECODE).astype(np.int32)
            out, bad, _ = gather(pool, table, ids, row_hi=ROWS)
            assert bad == 0
            np.testing.assert_array_equal(out, table[ids])
        assert cpu_ns(crew) == crew_before, "a crew thread woke for a decode-size job"
        assert cpu_ns(workers) > workers_before
        # The caller left the prefill to the crew: it slept through its calls (a caller that gathers keeps
        # a core, or its share of one beside busy threads); how long the calls took depends on the load.
        assert caller_spent < 0.2 * caller_wall, (caller_spent, caller_wall, crew_spent)
    finally:
        pool.close()


def test_without_the_rule_there_is_no_crew_and_a_new_daemon_can_ask_for_one(table):
    before_crew = gather_threads("engram-prefill")
    plain = open_budget(0)
    assert not plain.prefill_idle
    pool = _host_gather.GatherPool(3, budget=plain)
    try:
        assert pool.prefill_crew == (0, 0) and gather_threads("engram-prefill") == before_crew
        assert pool.set_budget(open_budget(budget_file.FLAG_PREFILL_IDLE))  # a daemon restarted with the rule
        crew = gather_threads("engram-prefill") - before_crew
        assert pool.prefill_crew == (3, 0) and len(crew) == 3
        ids = np.random.default_rng(2).integers(0, ROWS, PREFILL).astype(np.int64)
        settle()
        spent = cpu_ns(crew)
        out, bad, _ = gather(pool, table, ids, row_hi=ROWS)
        np.testing.assert_array_equal(out, table[ids])
        assert bad == 0 and cpu_ns(crew) > spent
        assert pool.set_budget(open_budget(0))  # and one without it: prefill goes back to the workers
        settle(crew)
        spent = cpu_ns(crew)
        out, bad, _ = gather(pool, table, ids, row_hi=ROWS)
        np.testing.assert_array_equal(out, table[ids])
        assert bad == 0 and cpu_ns(crew) == spent
    finally:
        pool.close()
    assert not gather_threads("engram-prefill") - before_crew


def test_a_pool_closed_under_a_prefill_job_on_another_thread_finishes_it(table):
    """The crew is joined under the job: its caller gathers what is left (on a token, or after
    NB_STARVE_NS without one).  A second open file description holds the tokens at first, so the
    job is surely in flight when the pool closes."""
    import threading

    fd = budget_file.create([2], flags=budget_file.FLAG_PREFILL_IDLE)
    holder = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
    try:
        assert budget_file.lock_token(holder, 0, 0) and budget_file.lock_token(holder, 0, 1)
        pool = _host_gather.GatherPool(2, budget=_host_gather.NodeBudget(fd, 0, 2, budget_file.MAX_SLOTS))
        ids = np.random.default_rng(3).integers(0, ROWS, PREFILL).astype(np.int64)
        result = {}

        def run():
            result["out"], result["bad"], _ = gather(pool, table, ids, row_hi=ROWS)

        thread = threading.Thread(target=run)
        thread.start()
        time.sleep(0.3)
        assert thread.is_alive()  # waiting: the tokens are held
        pool.close()
        thread.join(timeout=60)
        assert not thread.is_alive(), "a gather under a closing pool did not finish"
        assert result["bad"] == 0
        np.testing.assert_array_equal(result["out"], table[ids])
    finally:
        os.close(holder)
        os.close(fd)


REFUSED = r'''
import ctypes, os, struct, sys
import numpy as np
libc = ctypes.CDLL(None, use_errno=True)
# A seccomp filter that answers sched_setscheduler (144) and sched_setattr (314) with EPERM on x86-64,
# as a sandbox may: the kernel refuses SCHED_IDLE to this process, for real.
code = [(0x20, 0, 0, 4), (0x15, 0, 4, 0xC000003E), (0x20, 0, 0, 0), (0x15, 1, 0, 144), (0x15, 0, 1, 314),
        (0x06, 0, 0, 0x00050000 | 1), (0x06, 0, 0, 0x7FFF0000)]
filt = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *c) for c in code))
prog = struct.pack("HxxxxxxQ", len(code), ctypes.addressof(filt))
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.c_char_p(prog), 0, 0) == 0, ctypes.get_errno()  # PR_SET_SECCOMP, FILTER
from engram_client.core import budget_file
from engram_client.lookup.host import _host_gather
from engram_client.lookup.host.gather_seat import GatherSeat
fd = budget_file.create([2], flags=budget_file.FLAG_PREFILL_IDLE)
budget = _host_gather.NodeBudget(fd, 0, 2, budget_file.MAX_SLOTS)
seat = GatherSeat(2, "gathers on the node's budget", budget)
pool = seat.open_pool()
table = np.random.default_rng(0).integers(0, 256, (1 << 14, 264), dtype=np.uint8)
ids = np.random.default_rng(1).integers(0, 1 << 14, budget_file.SMALL_ROWS + 4096).astype(np.int64)
out = np.zeros((ids.size, 264), np.uint8)
bad = pool.gather(table.ctypes.data, 0, 1 << 14, 264, ids.ctypes.data, True, ids.size, out.ctypes.data, 0)
print(pool.prefill_crew, bad, bool((out == table[ids]).all()))
print(seat.explanation)
pool.close()
'''


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the seccomp filter is written for x86-64")
def test_a_process_refused_sched_idle_says_so_and_gathers_its_prefill_at_normal_priority():
    import errno
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", REFUSED], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    crew, explanation = run.stdout.splitlines()[:2]
    assert crew == f"(0, {errno.EPERM}) 0 True", run.stdout  # no crew, the refusal kept; the prefill exact
    assert "may not start threads at that policy (Operation not permitted)" in explanation, explanation
    assert "may not start threads at that policy" in run.stderr  # and a warning in the log
