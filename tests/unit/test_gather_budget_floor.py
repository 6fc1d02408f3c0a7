"""Small calls first, but a prefill is never starved: its floor of one token on the node budget.

Decode-size jobs (at most small_rows rows) take tokens before prefill-size ones, and a prefill
gives its tokens back at the next block boundary while one waits.  With that rule alone, seven
decoding ranks on 15 tokens held a prefilling rank at 1.3 M rows/s on the H200 machine
(docs/history/benchmarks-2026-12.md, "Many ranks, the host stage alone").  In a group of NB_FLOOR_MIN_TOKENS (4)
tokens or more a prefill holding none may now take a free token while decode-size jobs wait.

The waiting decode jobs are written into the budget's shared group as four peers would mark them
(want and small bits of slots that hold nothing), a real sealed memfd and a real pool: the
prefill's first grant must be made while they wait.  Before the floor it was refused until a
sweep had found those slots dead and cleared their bits; with one token (below the floor's
minimum) it still is.  The grant log the budget keeps records the masks of every decision.
"""
from __future__ import annotations

import mmap
import os
import struct

import numpy as np
import pytest

from engram_client.core import budget_file
from engram_client.lookup.host import _host_gather
from test_host_gather import gather

ROWS, ROW_BYTES, PREFILL = 1 << 16, 264, 65536
WANT_MASK_AT = budget_file.GROUPS_AT + 3 * 8  # NbGroup: lock, lock_count, breaks, want_mask, small_mask
SMALL_MASK_AT = WANT_MASK_AT + 8
PEERS = 0b1111 << 40  # four slots that wait with decode-size jobs and hold nothing


def first_grant_with_waiting_peers(tokens: int, decode: int = 0) -> bool:
    fd = budget_file.create([tokens], decode=[decode])
    try:
        budget = _host_gather.NodeBudget(fd, 0, tokens, budget_file.MAX_SLOTS)
        pool = _host_gather.GatherPool(2, caller_gathers=False, budget=budget)
        try:
            mapped = mmap.mmap(fd, budget_file.FILE_BYTES)
            for at in (WANT_MASK_AT, SMALL_MASK_AT):
                struct.pack_into("<Q", mapped, at, PEERS)
            table = np.random.default_rng(0).integers(0, 256, (ROWS, ROW_BYTES), dtype=np.uint8)
            ids = np.random.default_rng(1).integers(0, ROWS, PREFILL).astype(np.int64)
            out, bad, _ = gather(pool, table, ids, row_hi=ROWS, row_bytes=ROW_BYTES)
            assert bad == 0
            np.testing.assert_array_equal(out, table[ids])
            grants = [entry for entry in budget.grant_log() if entry[1] == budget.slot and entry[4] == 0]
            assert grants and not grants[0][3], grants[:3]  # a token, for the prefill (not small)
            mapped.close()
            return grants[0][7] & PEERS == PEERS  # its small_mask at that decision
        finally:
            pool.close()
    finally:
        os.close(fd)


def test_a_prefill_takes_its_floor_token_while_decode_jobs_wait():
    assert first_grant_with_waiting_peers(4)


def test_peers_that_claim_to_decode_do_not_starve_a_prefill_beside_decode_tokens():
    """Four slots marked as waiting decode jobs, on a group keeping all but one token for decode:
    the prefill still gets its floor token at once (what a claim to be decoding can win is bounded)."""
    assert first_grant_with_waiting_peers(4, decode=3)


@pytest.mark.parametrize("tokens", [1, 3])
def test_below_the_floors_minimum_the_prefill_still_waits_for_decode_jobs(tokens):
    assert not first_grant_with_waiting_peers(tokens)
