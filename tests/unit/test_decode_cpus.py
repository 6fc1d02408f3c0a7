"""Decode CPUs: tokens and CPUs of a budget group where no prefill-size gather of normal priority runs.

The daemon's plan (engramd/daemon/decode_cpus.py), the budget header that carries it, and a real
pool on a real sealed budget memfd in this process: its prefill crew pinned off the decode CPUs at
normal priority, its spares at SCHED_IDLE on them, and the token rule read from the budget's own
counters and grant log (a prefill-size job never takes a token that would leave fewer than the
decode tokens free).  No timing asserts.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from engram_client.core import budget_file
from engram_client.core.errors import ConfigError
from engram_client.lookup.host import _host_gather
from engramd.daemon.decode_cpus import decode_counts, decode_cpus
from test_host_gather import gather, gather_threads

ROWS, ROW_BYTES = 1 << 16, 264
PREFILL, DECODE = budget_file.SMALL_ROWS + 16384, 6144
TWO_CPUS = len(os.sched_getaffinity(0)) >= 2


def test_auto_keeps_two_decode_cpus_per_5_tokens_rounded_down_in_groups_of_4_or_more():
    assert decode_counts([1, 2, 3, 4, 7, 8, 9, 12, 15, 16, 52], "auto") == [0, 0, 0, 1, 2, 3, 3, 4, 6, 6, 20]
    assert decode_counts([15, 56], "auto", "idle") == [0, 0]  # the idle crew leaves every CPU to decode calls
    assert decode_counts([15, 4], "3") == [3, 3] and decode_counts([2], "0") == [0]
    assert decode_cpus(tuple(range(16)), 2) == [14, 15] and decode_cpus((0, 1), 0) == []


@pytest.mark.parametrize("spec, tokens, prefill, words", [
    ("2", [4, 2], "normal", "group 1 of the gather budget has 2 tokens"),
    ("1", [4], "idle", "--prefill-gathers idle"),
    ("some", [4], "normal", "'auto' or a number"),
    ("-1", [4], "normal", "'auto' or a number"),
])
def test_a_bad_decode_cpus_names_what_is_wrong(spec, tokens, prefill, words):
    with pytest.raises(ConfigError, match=words):
        decode_counts(tokens, spec, prefill)


def test_the_header_carries_the_decode_tokens_and_a_rank_reads_them():
    fd = budget_file.create([4, 2], decode=[1, 0])
    try:
        view = budget_file.BudgetView(fd)
        assert view.tokens == [4, 2] and view.decode == [1, 0]
        view.close()
        assert _host_gather.NodeBudget(fd, 0, 4, budget_file.MAX_SLOTS).decode_tokens == 1
        assert _host_gather.NodeBudget(fd, 1, 2, budget_file.MAX_SLOTS).decode_tokens == 0
    finally:
        os.close(fd)
    with pytest.raises(ConfigError, match="0..tokens-1 decode tokens"):
        budget_file.create([2], decode=[2])  # at least one token stays for prefill


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (ROWS, ROW_BYTES), dtype=np.uint8)


def ids_of(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, ROWS, rows).astype(np.int64)


def gathers_exactly(pool, table: np.ndarray, ids: np.ndarray) -> None:
    out, bad, _ = gather(pool, table, ids, row_hi=ROWS)
    assert bad == 0
    np.testing.assert_array_equal(out, table[ids])


def policy_and_cpus(tids: set[int]) -> set[tuple[int, frozenset]]:
    return {(os.sched_getscheduler(tid), frozenset(os.sched_getaffinity(tid))) for tid in tids}


@pytest.mark.skipif(not TWO_CPUS, reason="needs two CPUs to split")
def test_prefill_runs_off_the_decode_cpu_and_takes_no_token_that_would_leave_none_for_decode(table):
    before = {name: gather_threads(name) for name in ("engram-gather", "engram-prefill", "engram-spare")}
    fd = budget_file.create([2], decode=[1])
    try:
        budget = _host_gather.NodeBudget(fd, 0, 2, budget_file.MAX_SLOTS)
    finally:
        os.close(fd)
    pool = _host_gather.GatherPool(2, budget=budget, cpus=[0, 1])
    try:
        new = {name: gather_threads(name) - tids for name, tids in before.items()}
        # Two threads asked, one CPU off the decode CPU: one crew thread (a second could never gather).
        assert pool.prefill_crew == (1, 0) and pool.prefill_spares == (1, [1]) and len(new["engram-prefill"]) == 1
        assert policy_and_cpus(new["engram-prefill"]) == {(os.SCHED_OTHER, frozenset({0}))}
        assert policy_and_cpus(new["engram-spare"]) == {(os.SCHED_IDLE, frozenset({1}))}
        assert policy_and_cpus(new["engram-gather"]) == {(os.SCHED_OTHER, frozenset({0, 1}))}  # decode: every CPU
        for seed in range(3):
            gathers_exactly(pool, table, ids_of(4 * PREFILL, seed))
        # Two tokens, one kept for decode: never more than one gathered on a token.
        assert budget.group_state()["peak"] == 1, budget.group_state()
        prefill = [entry for entry in budget.grant_log() if not entry[3]]  # (seq, slot, token, small, how, held, ..)
        assert prefill and all(entry[5] <= 1 for entry in prefill), prefill
        gathers_exactly(pool, table, ids_of(DECODE, 3))
        assert any(entry[3] for entry in budget.grant_log())  # the decode-size job got its token
    finally:
        pool.close()
    assert not gather_threads("engram-spare") - before["engram-spare"]  # joined with the crew


def test_without_decode_tokens_or_pinning_there_is_no_split():
    for decode, cpus in ((0, [0, 1]), (1, [0]), (1, None)):  # none kept; one CPU only; not pinned
        fd = budget_file.create([3], decode=[decode])
        try:
            pool = _host_gather.GatherPool(2, budget=_host_gather.NodeBudget(fd, 0, 3, budget_file.MAX_SLOTS),
                                           cpus=cpus)
        finally:
            os.close(fd)
        try:
            assert pool.prefill_crew == (0, 0) and pool.prefill_spares == (0, [])
        finally:
            pool.close()


def open_budget(tokens: int, decode: int = 0, flags: int = 0):
    fd = budget_file.create([tokens], decode=[decode], flags=flags)
    try:
        return _host_gather.NodeBudget(fd, 0, tokens, budget_file.MAX_SLOTS)
    finally:
        os.close(fd)


@pytest.mark.skipif(not TWO_CPUS, reason="needs two CPUs to split")
def test_a_pool_moved_to_a_daemon_with_another_prefill_rule_changes_its_crew(table):
    before = {name: gather_threads(name) for name in ("engram-prefill", "engram-spare")}

    def crew() -> tuple[set, set]:
        return tuple(policy_and_cpus(gather_threads(name) - tids) for name, tids in before.items())
    pool = _host_gather.GatherPool(2, budget=open_budget(2, decode=1), cpus=[0, 1])
    try:
        assert crew() == ({(os.SCHED_OTHER, frozenset({0}))}, {(os.SCHED_IDLE, frozenset({1}))})
        assert pool.set_budget(open_budget(2, flags=budget_file.FLAG_PREFILL_IDLE))  # --prefill-gathers idle
        assert pool.prefill_spares == (0, []) and crew() == ({(os.SCHED_IDLE, frozenset({0, 1}))}, set())
        assert pool.set_budget(open_budget(2))  # no rule: the crew stays, unused
        assert crew() == ({(os.SCHED_IDLE, frozenset({0, 1}))}, set())
        assert pool.set_budget(open_budget(2, decode=1))  # decode CPUs again
        assert pool.prefill_crew == (1, 0) and pool.prefill_spares == (1, [1])
        assert crew() == ({(os.SCHED_OTHER, frozenset({0}))}, {(os.SCHED_IDLE, frozenset({1}))})
        gathers_exactly(pool, table, ids_of(PREFILL, 4))
    finally:
        pool.close()


@pytest.mark.skipif(not TWO_CPUS, reason="needs two CPUs to split")
def test_a_pool_whose_first_crew_was_cut_to_its_cpus_starts_a_whole_crew_for_a_later_budget(table):
    """A crew is cut to the CPUs off the decode CPUs (one here, of a 100-thread pool); a later
    budget's --prefill-gathers idle crew is the pool's size, and its threads must all have room."""
    before = gather_threads("engram-prefill")
    pool = _host_gather.GatherPool(100, budget=open_budget(2, decode=1), cpus=[0, 1])
    try:
        assert pool.prefill_crew == (1, 0) and len(gather_threads("engram-prefill") - before) == 1
        assert pool.set_budget(open_budget(2, flags=budget_file.FLAG_PREFILL_IDLE))
        assert pool.prefill_crew == (100, 0) and len(gather_threads("engram-prefill") - before) == 100
        gathers_exactly(pool, table, ids_of(PREFILL, 6))
    finally:
        pool.close()
    assert not gather_threads("engram-prefill") - before


@pytest.mark.skipif(os.uname().machine != "x86_64" or not TWO_CPUS, reason="an x86-64 seccomp filter; two CPUs")
def test_a_process_refused_sched_idle_for_its_spares_says_so_and_gathers_its_prefill_everywhere():
    """The sandbox of test_prefill_crew.py (a real seccomp filter refusing sched_setscheduler), on a
    budget with a decode CPU instead of the idle rule: the spares cannot start, so neither does the
    crew, and the prefill runs, exact, on the workers."""
    import errno
    import subprocess
    import sys

    from test_prefill_crew import REFUSED

    script = REFUSED.replace("budget_file.create([2], flags=budget_file.FLAG_PREFILL_IDLE)",
                             "budget_file.create([2], decode=[1])")
    script = script.replace('GatherSeat(2, "gathers on the node\'s budget", budget)',
                            'GatherSeat(2, "gathers on the node\'s budget", budget, cpus=[0, 1])')
    assert script.count("decode=[1]") == 1 and script.count("cpus=[0, 1]") == 1  # the sandbox script as we expect it
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    crew, explanation = run.stdout.splitlines()[:2]
    assert crew == f"(0, {errno.EPERM}) 0 True", run.stdout
    assert "1 token of the group kept for decode-size calls (--decode-cpus), but this pool's prefill-size calls " \
        "run on every CPU" in explanation and "(Operation not permitted)" in explanation, explanation
    assert "may not start the prefill crew's spares at SCHED_IDLE" in run.stderr


@pytest.mark.skipif(not TWO_CPUS, reason="needs two CPUs to split")
def test_a_budget_without_spares_keeps_the_crew_off_the_decode_cpu_and_starts_none(table):
    before = {name: gather_threads(name) for name in ("engram-prefill", "engram-spare")}
    pool = _host_gather.GatherPool(2, budget=open_budget(2, decode=1, flags=budget_file.FLAG_NO_SPARES), cpus=[0, 1])
    try:
        assert pool.prefill_crew == (1, 0) and pool.prefill_spares == (0, [1])
        assert policy_and_cpus(gather_threads("engram-prefill") - before["engram-prefill"]) == \
            {(os.SCHED_OTHER, frozenset({0}))}
        assert not gather_threads("engram-spare") - before["engram-spare"]
        gathers_exactly(pool, table, ids_of(PREFILL, 5))
    finally:
        pool.close()
