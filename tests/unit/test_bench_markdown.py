"""`engramd bench --markdown`: the tables BENCHMARKS.md records, and the targets judged from a run."""
from __future__ import annotations

from engram_client.tools.bench_markdown import markdown


def method(ms: float, host_ms: float) -> dict:
    return {"median_ms": ms, "min_ms": ms, "max_ms": ms, "host_ms": host_ms, "useful_GBps": 1.0,
            "speedup_vs_naive": 1.0, "vs_copy_time": 1.0}


def results() -> dict:
    cases = [{"rows": 6144, "distribution": "uniform", "distinct_rows_median": 6100, "copy": method(0.04, 0.01),
              "naive": method(0.4, 0.05), "ours:host": method(0.2, 0.025), "ours:uva:auto/p33": method(0.39, 0.1)},
             {"rows": 393216, "distribution": "uniform", "distinct_rows_median": 390000, "copy": method(1.9, 0.01),
              "naive": method(20.0, 0.05), "naive-words": method(11.5, 0.05), "ours:host": method(4.6, 0.16)}]
    overlap = {"alone_ms": {"median_ms": 100.0}, "with_prefetch_ms": {"median_ms": 101.5}, "lookups_ms": {},
               "slowdown": 0.015}
    return {"gpu": "NVIDIA H200", "layer": 1, "table_bytes": 64 * 2**30, "gather_threads": 15, "iterations": 7,
            "cases": cases, "overlap": [dict(overlap, path="host", max_programs=None),
                                        dict(overlap, path="uva", max_programs=33, slowdown=0.28)]}


def test_every_method_is_a_row_and_targets_are_judged_from_the_run():
    text = markdown(results())
    assert "| 6,144 | uniform | 0.993 | ours:host | 0.200 | 0.025 |" in text
    assert "| 393,216 | uniform | 0.992 | naive | 20.000 |" in text
    # Ratios are against naive-words where the run has it (11.5 / 4.6), else the byte baseline (0.4 / 0.2).
    assert "| 393,216 | uniform | 0.992 | ours:host | 4.600 | 0.160 | 1.0 | 2.50 |" in text
    assert "| 6,144 | uniform | 0.993 | ours:host | 0.200 | 0.025 | 1.0 | 2.00 |" in text
    assert "| uva | 33 | 100.00 | 101.50 | +28.0% |" in text
    assert "| 393,216 uniform ids | 4.600 ms | 4.000 ms | no |" in text
    assert "| 6,144 uniform ids, GPU-visible time | 0.200 ms | 0.100 ms | no |" in text
    assert "| host time per call at 6,144 ids (eager, ids on the GPU) | 0.025 ms | 0.030 ms | yes |" in text
    assert "(host path) | +1.5% | 2% | yes |" in text
    assert "Zipf" not in text, "a target the run did not measure is left out, not invented"


def test_the_text_a_run_used_is_named_and_a_run_without_text_says_nothing_of_it():
    named = markdown(dict(results(), text={"python": "3.12.3", "chars": 171234, "sha256": "0123456789abcdef"}))
    assert "Text ids: Python 3.12.3's topic docs and this project's docs, 171,234 characters, sha256 " \
           "0123456789abcdef." in named
    assert "Text ids" not in markdown(results())
