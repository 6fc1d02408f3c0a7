"""benchmarks/node/lone_rules.py: one rank alone under several budget rules taking turns; its
summary puts each round's median against the first rule's of the same round (the paired measure
the GPU machines' drift between runs calls for), and it refuses rules it cannot compare."""
from __future__ import annotations

import pytest

from benchmarks.node.lone_rules import DECODE, PREFILL, parse_rules, summarize


def test_each_round_is_put_against_the_first_rules_round():
    def rnd(zero_prefill, default_prefill, zero_decode, default_decode):
        return {"decode-0": {PREFILL: {"median_ms": zero_prefill, "p90_ms": zero_prefill * 1.1},
                             DECODE: {"median_ms": zero_decode, "p90_ms": zero_decode * 1.2}},
                "default": {PREFILL: {"median_ms": default_prefill, "p90_ms": default_prefill * 1.1},
                            DECODE: {"median_ms": default_decode, "p90_ms": default_decode * 1.2}}}
    # The machine drifts between rounds (5.0 -> 6.0 ms); the default stays 1.02-1.04x the budget before it.
    summary = summarize(["decode-0", "default"], [rnd(5.0, 5.1, 0.25, 0.25), rnd(6.0, 6.24, 0.30, 0.27),
                                                  rnd(5.5, 5.665, 0.28, 0.28)])
    prefill = summary["default"][str(PREFILL)]
    assert prefill["round_medians_ms"] == [5.1, 6.24, 5.665] and prefill["median_ms"] == 5.665
    assert prefill["round_x_decode-0"] == pytest.approx([1.02, 1.04, 1.03]) and prefill["x_decode-0"] == pytest.approx(1.03)
    assert summary["default"][str(DECODE)]["x_decode-0"] == pytest.approx(1.0)
    assert summary["decode-0"][str(PREFILL)]["round_x_decode-0"] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("rules", ["default", "default,default", "default,decode-9", ""])
def test_rules_it_cannot_compare_are_refused_by_name(rules):
    with pytest.raises(SystemExit, match="--rules .*two or more different rules of default, "):
        parse_rules(rules)


def test_known_rules_are_kept_in_order():
    assert parse_rules("decode-0,default,spares-off") == ["decode-0", "default", "spares-off"]
