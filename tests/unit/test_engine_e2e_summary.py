"""benchmarks/engine/e2e.py's busy summary: the measures issue 35 judges (the decode step's median
and p90 alone and beside busy neighbours, a lone lookup's p90, the neighbours' own rows/s), from a
run's results as the benchmark records them."""
from __future__ import annotations

from benchmarks.engine.e2e_summary import busy_summary


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
                "lookup_p90_x": 5.7, "lookup_alone_p90_ms": 0.3, "lookup_busy_p90_ms": 1.71,
                "neighbours_m_rows_per_s": rows}

    summaries = with_baseline({"default": summary(1.005, 28.1), "decode-0": summary(1.134, 28.7)}, "decode-0")
    assert summaries["default"]["neighbours_x_baseline"] == 0.979 and summaries["decode-0"]["neighbours_x_baseline"] == 1.0
    lines = table(summaries, "decode-0").splitlines()
    assert len(lines) == 4 and lines[0].count("|") == lines[2].count("|") == lines[3].count("|")
    assert lines[0].endswith("| ×decode-0 |") and "| median ×decode-0 alone |" in lines[0]
    assert lines[2].startswith("| default | `(none)` |") and lines[2].endswith("| 28.1 | 0.98x |")
    assert "| 1.005x | 1.400x | 1.005x | 5.7x | 5.70x |" in lines[2]  # against the baseline's own rank alone
    assert f"`{RULES['decode-0']}`" in lines[3] and lines[3].endswith("| 28.7 | 1.00x |")
    alone = with_baseline({"idle": summary(1.006, 34.5)}, "decode-0")  # the baseline did not run: no ratio
    assert alone["idle"]["neighbours_x_baseline"] is None and alone["idle"]["step_busy_x_baseline_alone"] is None
    assert table(alone, "decode-0").splitlines()[2].endswith("| 34.5 | — |")


def test_a_rule_whose_rank_asks_a_decode_path_says_so_and_is_run_with_it(monkeypatch, tmp_path):
    """gpu-decode's rank takes the UVA kernel for decode-size calls: the table names it, the run passes it to
    e2e (the command is captured, not run), and lone_rules, whose ranks cannot take it, refuses the rule."""
    import json
    import subprocess

    import pytest

    from benchmarks.engine import busy_rules
    from benchmarks.node import lone_rules

    seen = []

    def fake_run(command, **kwargs):
        seen.append(command)
        path = command[command.index("--json") + 1]
        with open(path, "w") as f:
            json.dump({"models": {"2048x16": {"busy_summary": {"step_alone_ms": 1.0}}}}, f)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(busy_rules.subprocess, "run", fake_run)
    args = type("Args", (), {"keep": None, "table_gib": 1.0, "decode_steps": 2, "rounds": 1, "busy_neighbours": 1})
    busy_rules.run_rule("gpu-decode", args, str(tmp_path))
    busy_rules.run_rule("decode-0", args, str(tmp_path))
    assert seen[0][seen[0].index("--decode-path") + 1] == "uva" and "--decode-path" not in seen[1]
    assert busy_rules.rule_words("gpu-decode") == "`--decode-cpus 0`, decode_path `uva`"
    with pytest.raises(SystemExit, match="gpu-decode set the ranks' decode path"):
        lone_rules.parse_rules("default,gpu-decode")


def test_a_baseline_outside_the_rules_is_refused_before_any_run(monkeypatch):
    import pytest

    from benchmarks.engine import busy_rules

    monkeypatch.setattr("sys.argv", ["busy_rules", "--rules", "default,decode-4", "--baseline", "decode-0"])
    monkeypatch.setattr(busy_rules, "run_rule", lambda *a: pytest.fail("a rule ran"))
    with pytest.raises(SystemExit, match="--baseline 'decode-0' is not among --rules"):
        busy_rules.main()
