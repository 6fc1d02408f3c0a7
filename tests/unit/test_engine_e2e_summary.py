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
