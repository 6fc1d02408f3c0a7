"""The node's gather budget on the host path, on CUDA: ranks on one GPU share the daemon's default
budget, every lookup exact, never more gathering threads than tokens, decode calls first; the same
with --prefill-gathers idle, where each rank's prefill-size lookups (started by its CUDA stream) run
on its crew at SCHED_IDLE."""
from __future__ import annotations

import os

import pytest

from budget_ranks import Ranks
from engram_client.lookup.host import _host_gather
from engram_client.core import budget_file

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("prefill_gathers", ["normal", "idle"])
def test_gpu_ranks_share_the_default_budget_exactly(daemon_factory, prefill_gathers):
    daemon = daemon_factory("--lease-seconds", "1.5", "--prefill-gathers", prefill_gathers)
    spec = daemon.wait_state("ready")["gather_budget"]
    tokens = spec["groups"][0]["tokens"]
    assert tokens == len(os.sched_getaffinity(0)) - 1  # one GPU here: one core left to the engine
    group = Ranks(daemon.endpoint, [(393216, 6, 0), (6144, 60, 0), (6144, 60, 0), (49152, 12, 0)], device="cuda:0")
    try:
        assert all(r["threads"] == min(tokens, 64) for r in group.ready), group.ready
        assert all(("at SCHED_IDLE" in r["words"]) == (prefill_gathers == "idle") for r in group.ready), group.ready
        group.go()
        results = group.results()
    finally:
        group.close()
    fd = budget_file.receive(spec["socket"], 5.0)
    try:
        state = _host_gather.NodeBudget(fd, 0, tokens, budget_file.MAX_SLOTS).group_state()
    finally:
        os.close(fd)
    print(state, [r["stats"] for r in results])
    assert 1 <= state["peak"] <= tokens, state
    assert all(r["stats"]["overdraft"] == 0 for r in results), results
    assert all(r["stats"]["small_wait_blocks_max"] <= 2 * tokens for r in results[1:3]), results
