"""The node's gather budget on the host path, on CUDA: ranks on one GPU share the daemon's default
budget, every lookup exact, never more gathering threads than tokens, decode calls first; the same
with --prefill-gathers idle, where each rank's prefill-size lookups (started by its CUDA stream) run
on its crew at SCHED_IDLE, and with the default decode CPUs, where they run on its crew off those
CPUs (and without them: --decode-cpus 0)."""
from __future__ import annotations

import os

import pytest

from budget_ranks import Ranks
from engram_client.lookup.host import _host_gather
from engram_client.core import budget_file
from engramd.daemon.decode_cpus import decode_counts

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("prefill_gathers, decode_cpus", [("normal", "auto"), ("normal", "0"), ("idle", "auto")])
def test_gpu_ranks_share_the_default_budget_exactly(daemon_factory, prefill_gathers, decode_cpus):
    daemon = daemon_factory("--lease-seconds", "1.5", "--prefill-gathers", prefill_gathers, "--decode-cpus", decode_cpus)
    spec = daemon.wait_state("ready")["gather_budget"]
    tokens, decode = spec["groups"][0]["tokens"], spec["groups"][0]["decode_tokens"]
    assert [decode] == decode_counts([tokens], decode_cpus, prefill_gathers)  # the daemon's plan, as announced
    assert decode == (0 if decode_cpus == "0" or prefill_gathers == "idle" else 6 if tokens == 15 else decode)
    assert tokens == len(os.sched_getaffinity(0)) - 1  # one GPU here: one core left to the engine
    group = Ranks(daemon.endpoint, [(393216, 6, 0), (6144, 60, 0), (6144, 60, 0), (49152, 12, 0)], device="cuda:0")
    try:
        assert all(r["threads"] == min(tokens, 64) for r in group.ready), group.ready
        assert all(("gathered by" in r["words"] and "at SCHED_IDLE" in r["words"]) == (prefill_gathers == "idle" or
                   decode > 0) for r in group.ready), group.ready
        assert all(("kept off the decode CPUs" in r["words"]) == (decode > 0) for r in group.ready), group.ready
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
