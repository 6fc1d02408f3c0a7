"""--decode-spares quiet: the prefill crew's spares on the decode CPUs stand aside while a rank of
the node decodes, and gather again once the node has been without a decode-size job for the window.

A spare at SCHED_IDLE that gathers prefill blocks on a decode CPU beside a decode call holds that
CPU until the kernel preempts it; on the H200 machine the decode CPUs without spares kept a lone
lookup's p90 beside three prefilling ranks at 1.65-2.12x its p90 alone, against 2.1-6.2x with
spares that gather whenever the CPU is free (docs/history/benchmarks-2026-12.md).

Here this process is a prefilling rank with one spare on the second of two CPUs, and a real peer
process on the same sealed memfd budget decodes (2,048-row gathers back to back): the group's
decode_at is the only thing the two share.  The pool's spare counts say what the spare did:
under the quiet rule it gathers nothing while the peer decodes and stands aside instead; under
the idle rule (the control) it gathers beside the peer; with the peer gone it gathers again.  A
peer that writes a time ahead of the machine's clock keeps no spare aside; one that writes the
present over and over keeps them aside and costs the prefill nothing else.  Every row is checked.
No timing asserts: the window (100 ms) is waited out, never measured.
"""
from __future__ import annotations

import mmap
import os
import struct
import subprocess
import time

import numpy as np
import pytest

from engram_client.core import budget_file
from engram_client.lookup.host import _host_gather
from decode_claim import DecodeClaim
from gathering_peer import COMMAND, reopened_budget
from test_host_gather import gather
from waiting import wait_for

TOKENS, DECODE_TOKENS, ROWS, ROW_BYTES = 2, 1, 1 << 16, 264
PREFILL_ROWS = budget_file.SMALL_ROWS * 4
CPUS = sorted(os.sched_getaffinity(0))[:2]
pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs: one for the crew, one decode CPU")

# The decoding peer (gathering_peer.py): a rank of its own gathering 2,048-row jobs back to back
# until its stdin closes, then printing the longest gap between two of its jobs' starts (ms): a peer
# descheduled that long (a loaded machine) let the window close, and the spare then rightly gathered.
PEER = COMMAND
STALLED_MS = 80  # a peer gap this long comes near the 100 ms window: that run proves nothing


def prefilling_rank(fd: int):
    """This process as a rank with a prefill crew on the first CPU and one spare on the second."""
    budget = reopened_budget(fd, TOKENS)
    pool = _host_gather.GatherPool(2, budget=budget, cpus=CPUS)
    assert pool.prefill_spares == (1, [CPUS[1]]), pool.prefill_spares
    return budget, pool


class Prefill:
    """Prefill-size gathers of fresh ids, every row checked."""

    def __init__(self, pool):
        self.pool = pool
        self.table = np.random.default_rng(0).integers(0, 256, (ROWS, ROW_BYTES), dtype=np.uint8)
        self.rng = np.random.default_rng(2)

    def __call__(self) -> None:
        ids = self.rng.integers(0, ROWS, PREFILL_ROWS).astype(np.int64)
        out, bad, _ = gather(self.pool, self.table, ids, row_hi=ROWS, row_bytes=ROW_BYTES)
        assert bad == 0
        np.testing.assert_array_equal(out, self.table[ids])

    def until(self, done, what: str) -> None:
        """Prefill calls, one after another, until ``done()`` holds (60 s at most)."""
        def prefilled() -> bool:
            self()
            return done()
        wait_for(prefilled, what, 60)


def beside_a_decoding_peer(fd: int, pool, budget, until, what: str) -> tuple[int, float]:
    """Prefill gathers beside the decoding peer until ``until()`` holds (60 s at most): the spare's
    blocks gathered meanwhile, and the peer's longest gap between two decode jobs or since its last
    one when the blocks were counted (ms)."""
    proc = subprocess.Popen([*PEER, str(fd), str(TOKENS), str(budget_file.MAX_SLOTS), "2", "2048"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, pass_fds=(fd,))
    try:
        int(proc.stdout.readline())  # its slot: it has gathered
        wait_for(lambda: budget.group_state()["decoding"], "the group's decode_at to say a rank decodes", 30)
        blocks_before = pool.spare_counts[0]
        Prefill(pool).until(until, what)
        blocks = pool.spare_counts[0] - blocks_before
        since_last_ms = (time.monotonic_ns() - budget.group_state()["decode_at"]) / 1e6
    finally:
        proc.stdin.close()
        longest = float(proc.stdout.readline())
        assert proc.wait(timeout=60) == 0
    return blocks, max(longest, since_last_ms)


def test_quiet_spares_stand_aside_while_a_peer_decodes_and_gather_once_it_stops():
    fd = budget_file.create([TOKENS], decode=[DECODE_TOKENS], flags=budget_file.FLAG_SPARES_QUIET)
    try:
        budget, pool = prefilling_rank(fd)
        try:
            for attempt in range(3):
                asides = pool.spare_counts[1]
                blocks, longest = beside_a_decoding_peer(
                    fd, pool, budget, lambda: pool.spare_counts[1] > asides,
                    "the spare to stand aside for the decoding peer")
                if longest < STALLED_MS:
                    break
            else:
                pytest.skip(f"the decoding peer stalled {longest:.0f} ms or more in each of 3 runs: the window closed")
            assert blocks == 0, f"the spare gathered {blocks} prefill blocks while a rank decoded"
            # The peer is gone: once the window has passed, the spare gathers the crew's jobs again.
            wait_for(lambda: not budget.group_state()["decoding"], "the decode window to close", 30)
            before = pool.spare_counts[0]
            Prefill(pool).until(lambda: pool.spare_counts[0] > before,
                                "the spare to gather prefill blocks with no rank decoding")
            assert not budget.group_state()["decoding"]
        finally:
            pool.close()
    finally:
        os.close(fd)


def test_idle_spares_gather_beside_a_decoding_peer_as_before():
    """The control: the same run under --decode-spares idle, where the spare never stands aside."""
    fd = budget_file.create([TOKENS], decode=[DECODE_TOKENS])
    try:
        budget, pool = prefilling_rank(fd)
        try:
            before = pool.spare_counts[0]
            blocks, _ = beside_a_decoding_peer(fd, pool, budget, lambda: pool.spare_counts[0] > before,
                                               "the spare to gather beside the decoding peer")
            assert blocks > 0 and pool.spare_counts[1] == 0
        finally:
            pool.close()
    finally:
        os.close(fd)


def test_a_decode_time_ahead_of_the_clock_keeps_no_spare_aside():
    """decode_at is a hint in memory every rank may write: a time ahead of the machine's clock is no
    rank's, so a peer cannot keep the spares off for good with one write (one that writes the present
    over and over costs what --decode-spares off costs)."""
    fd = budget_file.create([TOKENS], decode=[DECODE_TOKENS], flags=budget_file.FLAG_SPARES_QUIET)
    try:
        budget, pool = prefilling_rank(fd)
        mapped = mmap.mmap(fd, budget_file.FILE_BYTES)
        try:
            at = budget_file.GROUPS_AT + budget_file.GROUP_DECODE_AT
            struct.pack_into("<q", mapped, at, -2**63 + 1)  # no time at all: no decoding either
            assert not budget.group_state()["decoding"]
            struct.pack_into("<q", mapped, at, time.monotonic_ns() + 3600 * 10**9)
            assert not budget.group_state()["decoding"]
            before = pool.spare_counts[0]
            Prefill(pool).until(lambda: pool.spare_counts[0] > before,
                                "the spare to gather beside a decode time from the future")
            assert pool.spare_counts[1] == 0
            def stamped_now() -> bool:  # the present: a rank decodes (stamped again if this thread stalled)
                struct.pack_into("<q", mapped, at, time.monotonic_ns())
                return budget.group_state()["decoding"]
            wait_for(stamped_now, "a stamp of the present to read as decoding", 30)
        finally:
            mapped.close()
            pool.close()
    finally:
        os.close(fd)


def test_a_peer_claiming_to_decode_forever_costs_a_prefill_its_spares_and_nothing_more():
    """A peer that writes the present into decode_at over and over (here a thread of this process
    writing the shared memory as a peer process would) keeps the spares aside for as long as it
    writes; the prefill still gathers every row exactly, with no overdraft."""
    fd = budget_file.create([TOKENS], decode=[DECODE_TOKENS], flags=budget_file.FLAG_SPARES_QUIET)
    try:
        budget, pool = prefilling_rank(fd)
        mapped = mmap.mmap(fd, budget_file.FILE_BYTES)
        try:
            for attempt in range(3):
                blocks, longest = claimed_decoding(budget, pool, mapped)
                if longest < STALLED_MS:
                    break
            else:
                pytest.skip(f"the claiming thread stalled {longest:.0f} ms or more in each of 3 runs: the window closed")
            assert blocks == 0, f"the spare gathered {blocks} prefill blocks while a rank claimed to decode"
            assert budget.stats()["overdraft"] == 0
        finally:
            mapped.close()
            pool.close()
    finally:
        os.close(fd)


def claimed_decoding(budget, pool, mapped) -> tuple[int, float]:
    """Five prefill calls while decoding is claimed (after the spare has stood aside once): the
    spare's blocks meanwhile, and the longest pause between two stamps of the claim (ms)."""
    with DecodeClaim(mapped) as claim:
        wait_for(lambda: budget.group_state()["decoding"], "the claimed decoding to show in the group", 30)
        prefill, asides = Prefill(pool), pool.spare_counts[1]
        prefill.until(lambda: pool.spare_counts[1] > asides, "the spare to stand aside for the claim")
        blocks = pool.spare_counts[0]
        claim.reset()
        for _ in range(5):
            prefill()
        return pool.spare_counts[0] - blocks, claim.longest_gap_ms
