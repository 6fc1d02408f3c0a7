"""benchmarks/node/ranks_verdict.py's markdown names the budget a ranks run ran on, the prefill rule included: two runs
of the same table under different --prefill-gathers rules must not read alike; and benchmarks/node/ranks.py counts the
call still running when a case's window closes by its share inside it."""
from __future__ import annotations

import pytest

from benchmarks.node.ranks_verdict import markdown


def results(budget):
    case = {"ranks": 1, "case": "393,216", "node_Mrows_s": 63.2, "per_rank": [{"median_ms": 6.12, "p90_ms": 6.45}]}
    return {"budget": budget, "modes": [{"mode": "budget", "cases": [case]}], "targets": []}


def test_the_markdown_names_the_budget_and_its_prefill_rule():
    idle = markdown(results({"tokens": 12, "prefill_gathers": "idle"}))
    normal = markdown(results({"tokens": 12, "prefill_gathers": "normal"}))
    assert idle.splitlines()[0] == "The daemon's budget: 12 tokens, prefill-size calls gathered at SCHED_IDLE."
    assert "normal priority" in normal.splitlines()[0] and "| budget | 1 | 393,216 | 63.2 | 6.12 | 6.45 |" in normal
    assert markdown(results(None)).startswith("The daemon has no gather budget.")


def test_the_markdown_names_the_decode_cpus_where_the_budget_keeps_some():
    groups = [{"group": 0, "tokens": 15, "decode_tokens": 2, "decode_cpus": "13-14"}]
    text = markdown(results({"tokens": 15, "prefill_gathers": "normal", "groups": groups}))
    assert text.splitlines()[0].endswith("normal priority; decode CPUs 13-14."), text


def test_a_call_running_when_the_window_closes_counts_by_its_share_inside_it():
    from benchmarks.node.ranks import calls_in_window

    assert calls_in_window([(0.0, 0.4), (0.4, 0.8), (0.8, 1.2)], 1.0) == pytest.approx(2.5)
    # One call longer than the whole window (a slow node's 393,216 rows): its share, not no rows at all.
    assert calls_in_window([(0.0, 2.6)], 2.0) == pytest.approx(2.0 / 2.6)
    assert calls_in_window([], 1.0) == 0.0
