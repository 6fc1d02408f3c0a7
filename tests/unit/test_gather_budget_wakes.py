"""A decode-size job wakes only as many of its pool's sleeping workers as there are tokens free
while another rank wants tokens, and a pre-wake then wakes none.

Beside prefilling ranks, every worker a decode-size job woke without a token to gather on
registered, slept on its slot's futex and woke again when the job's last block went out: on the
H200 machine fifteen of them stood runnable on the few idle decode CPUs behind the three or four
that held tokens (docs/history/benchmarks-2026-12.md).  Here a real peer process on the same
sealed memfd budget keeps a pool of more workers than its tokens busy with prefill-size gathers
(so it holds the tokens a prefill may take and wants more), and this process gathers decode-size
jobs beside it: the pool's wake counts say how many sleeping workers each listing left asleep.
Every row is checked; alone, nothing is held back.
"""
from __future__ import annotations

import mmap
import os
import struct
import subprocess

import numpy as np

from engram_client.core import budget_file
from engram_client.lookup.host import _host_gather
from gathering_peer import COMMAND, reopened_budget
from test_host_gather import gather
from waiting import wait_for

TOKENS, DECODE, WORKERS, ROWS, ROW_BYTES, DECODE_ROWS = 3, 1, 6, 1 << 16, 264, 2048
WANT_MASK_AT = budget_file.GROUPS_AT + 3 * 8  # NbGroup: lock, lock_count, breaks, want_mask, small_mask, holding_mask
HOLDING_MASK_AT = WANT_MASK_AT + 2 * 8
HELD_IN_SLOT = 16  # NbSlot: seq, sleepers, want, want_small, held

# The peer (gathering_peer.py): a rank of its own (another process, another slot) gathering
# 65,536-row jobs with ten workers on the same budget until its stdin closes: more than the
# TOKENS - DECODE it may hold, so it wants tokens most of the time.
PEER = COMMAND


def rank_budget(fd: int):
    return reopened_budget(fd, TOKENS)


def decode_jobs(fd: int, calls: int, peer: bool) -> tuple[int, int, int]:
    """This process's wake counts after ``calls`` decode-size gathers (with the peer: until a
    listing held workers back and a pre-wake woke nobody, at most 60 s of them), every row checked."""
    budget = rank_budget(fd)
    pool = _host_gather.GatherPool(WORKERS, caller_gathers=True, budget=budget)
    proc = None
    try:
        if peer:
            proc = subprocess.Popen([*PEER, str(fd), str(TOKENS), str(budget_file.MAX_SLOTS), "10", "65536"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, pass_fds=(fd,))
            peer_slot = int(proc.stdout.readline())
        table = np.random.default_rng(0).integers(0, 256, (ROWS, ROW_BYTES), dtype=np.uint8)
        rng = np.random.default_rng(2)

        def decode_calls() -> bool:
            for _ in range(calls):
                pool.prewake()  # as an eager enqueue does before its host function
                ids = rng.integers(0, ROWS, DECODE_ROWS).astype(np.int64)
                out, bad, _ = gather(pool, table, ids, row_hi=ROWS, row_bytes=ROW_BYTES)
                assert bad == 0
                np.testing.assert_array_equal(out, table[ids])
            listings, _, prewakes = pool.wake_counts
            return listings > 0 and prewakes > 0
        if peer:
            wait_for(decode_calls, "a decode-size listing that left workers asleep and a pre-wake that woke "
                     "nobody, beside the prefilling peer", 60)
            assert peer_slot != budget.slot  # two ranks (a slot is claimed at the first token)
        else:
            decode_calls()
        return pool.wake_counts
    finally:
        pool.close()
        if proc is not None:
            proc.stdin.close()
            assert proc.wait(timeout=60) == 0


def test_beside_a_prefilling_peer_a_decode_job_leaves_the_workers_without_a_token_asleep():
    fd = budget_file.create([TOKENS], decode=[DECODE])
    try:
        listings, left, prewakes = decode_jobs(fd, 20, peer=True)
    finally:
        os.close(fd)
    # While the peer wanted tokens, at most DECODE (+ one it had not taken yet) were free at a
    # listing, of up to WORKERS - 1 sleeping: each such listing left at least one asleep.
    assert listings > 0 and left >= listings, (listings, left)
    assert prewakes > 0  # a pre-wake while the peer wanted tokens woke nobody: none would get one


def test_alone_every_sleeping_worker_is_woken_as_before():
    fd = budget_file.create([TOKENS], decode=[DECODE])
    try:
        assert decode_jobs(fd, 50, peer=False) == (0, 0, 0)
    finally:
        os.close(fd)


def test_a_peer_forging_wants_and_held_tokens_costs_a_decode_job_woken_workers_not_rows():
    """Hints are all a peer can forge: here every other slot says it wants tokens and one says it
    holds them all.  A decode-size job then wakes one sleeping worker (free tokens read as none;
    the rule never wakes none, which a stream-signalled job with no waiting thread needs), and
    with its own thread it still finishes, every row exact, on the tokens the kernel says are free
    or, held off, on the budget's bounded overdraft."""
    fd = budget_file.create([TOKENS], decode=[DECODE])
    try:
        budget = rank_budget(fd)
        pool = _host_gather.GatherPool(WORKERS, caller_gathers=True, budget=budget)
        try:
            table = np.random.default_rng(0).integers(0, 256, (ROWS, ROW_BYTES), dtype=np.uint8)
            ids = np.random.default_rng(3).integers(0, ROWS, DECODE_ROWS).astype(np.int64)
            gather(pool, table, ids, row_hi=ROWS, row_bytes=ROW_BYTES)  # claims this process's slot
            forger = 63 if budget.slot != 63 else 62
            mapped = mmap.mmap(fd, budget_file.FILE_BYTES)
            others = ((1 << 64) - 1) & ~(1 << budget.slot)
            for at in (WANT_MASK_AT, HOLDING_MASK_AT):
                struct.pack_into("<Q", mapped, at, others)
            struct.pack_into("<i", mapped, budget_file.SLOTS_AT + forger * budget_file.SLOT_BYTES + HELD_IN_SLOT, TOKENS)
            for seed in range(4, 8):
                ids = np.random.default_rng(seed).integers(0, ROWS, DECODE_ROWS).astype(np.int64)
                out, bad, _ = gather(pool, table, ids, row_hi=ROWS, row_bytes=ROW_BYTES)
                assert bad == 0
                np.testing.assert_array_equal(out, table[ids])
            listings, left, _ = pool.wake_counts
            assert listings > 0 and left >= listings, (listings, left)  # one woken of those asleep, not all
            mapped.close()
        finally:
            pool.close()
    finally:
        os.close(fd)
