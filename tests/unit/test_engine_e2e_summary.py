"""benchmarks/engine/e2e.py's busy summary: the measures issue 35 judges (the decode step's median
and p90 alone and beside busy neighbours, a lone lookup's p90, the neighbours' own rows/s), from a
run's results as the benchmark records them."""
from __future__ import annotations

from benchmarks.engine.e2e import busy_summary


def test_the_summary_puts_the_step_beside_neighbours_against_the_step_alone():
    model = {"decode": {"host": {"step_median_ms": 4.0, "step_p90_ms": 4.2}},
             "busy": {"neighbours": 3,
                      "decode": {"host+busy": {"step_median_ms": 4.4, "step_p90_ms": 10.0}},
                      "lookup_alone": {"p90_ms": 0.3}, "lookup_busy": {"p90_ms": 3.0},
                      "neighbour_reports": [{"m_rows_per_s": 10.0}, {"m_rows_per_s": 11.5}, {"m_rows_per_s": 9.0}]}}
    summary = busy_summary(model)
    assert summary["median_x"] == 1.1 and summary["p90_x_median_alone"] == 2.5 and summary["lookup_p90_x"] == 10.0
    assert summary["step_busy_p90_ms"] == 10.0 and summary["step_alone_p90_ms"] == 4.2
    assert summary["neighbours_m_rows_per_s"] == 30.5 and summary["each_neighbour"] == [10.0, 11.5, 9.0]


def test_the_rules_table_puts_each_rule_beside_the_baseline_rule():
    from benchmarks.engine.busy_rules import RULES, table, with_baseline

    def summary(median_x: float, rows: float) -> dict:
        return {"step_alone_ms": 6.5, "step_busy_ms": 6.5 * median_x, "median_x": median_x, "p90_x_median_alone": 1.4,
                "lookup_p90_x": 5.7, "neighbours_m_rows_per_s": rows}

    summaries = with_baseline({"default": summary(1.005, 28.1), "decode-0": summary(1.134, 28.7)}, "decode-0")
    assert summaries["default"]["neighbours_x_baseline"] == 0.979 and summaries["decode-0"]["neighbours_x_baseline"] == 1.0
    lines = table(summaries, "decode-0").splitlines()
    assert len(lines) == 4 and lines[0].count("|") == lines[2].count("|") == lines[3].count("|")
    assert lines[0].endswith("| ×decode-0 |")
    assert lines[2].startswith("| default | `(none)` |") and lines[2].endswith("| 28.1 | 0.98x |")
    assert f"`{RULES['decode-0']}`" in lines[3] and lines[3].endswith("| 28.7 | 1.00x |")
    alone = with_baseline({"idle": summary(1.006, 34.5)}, "decode-0")  # the baseline did not run: no ratio
    assert alone["idle"]["neighbours_x_baseline"] is None
    assert table(alone, "decode-0").splitlines()[2].endswith("| 34.5 | — |")


def test_a_baseline_outside_the_rules_is_refused_before_any_run(monkeypatch):
    import pytest

    from benchmarks.engine import busy_rules

    monkeypatch.setattr("sys.argv", ["busy_rules", "--rules", "default,decode-4", "--baseline", "decode-0"])
    monkeypatch.setattr(busy_rules, "run_rule", lambda *a: pytest.fail("a rule ran"))
    with pytest.raises(SystemExit, match="--baseline 'decode-0' is not among --rules"):
        busy_rules.main()
