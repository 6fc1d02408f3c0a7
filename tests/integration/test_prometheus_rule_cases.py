"""The alerts no live daemon here can bring about, evaluated by Prometheus's own rule engine.

A table of a gigabyte or more on 4 KiB pages for 15 minutes, ranks starved of gather tokens for
10, an HBM cache that misses for 30 (no CUDA here): `promtool test rules` runs the shipped rules
file, as shipped (`for:` durations included), over series written below in its notation, one
sample a minute, and these tests read which alerts fire from its ALERTS series.  The series
stand in for what the daemon would export in each case (names and labels as it exports them);
what runs on them is the real thing.  Each case sets a node or client that must fire beside ones that must not.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from prometheus_tools import prometheus_binaries  # noqa: F401  (a fixture)

yaml = pytest.importorskip("yaml")

RULES = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "observability", "engramd-rules.yaml")
GIB = 1 << 30
MINUTES = 45  # samples of each series, one a minute


def constant(value: float) -> str:
    return f"{value:g}x{MINUTES}"


def rising(per_minute: float) -> str:
    return f"0+{per_minute:g}x{MINUTES}"


def series(name: str, values: str, **labels: str) -> dict:
    labels = {"job": "engramd", **labels}
    return {"series": name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}


def node(instance: str, table_bytes: float, huge_bytes: float, ready: bool) -> list[dict]:
    return [series("engramd_table_bytes", constant(table_bytes), instance=instance),
            series("engramd_table_huge_page_bytes", constant(huge_bytes), instance=instance),
            series("engramd_state", constant(1 if ready else 0), instance=instance, state="ready")]


def gather_client(client: str, threads: int, waited_share: float) -> list[dict]:
    labels = {"instance": "node-a", "client": client, "rank": "0", "cpus": "0-14"}
    return [series("engramd_client_gather_threads", constant(threads), **labels),
            series("engramd_client_gather_wait_seconds", rising(60 * threads * waited_share), **labels)]


def cache_client(client: str, cache_bytes: float, hits_per_minute: float, misses_per_minute: float) -> list[dict]:
    labels = {"instance": "node-a", "client": client, "rank": "0"}
    return [series("engramd_client_cache_bytes", constant(cache_bytes), **labels),
            series("engramd_client_cache_hits", rising(hits_per_minute), **labels),
            series("engramd_client_cache_misses", rising(misses_per_minute), **labels)]


def firing(promtool: str, tmp_path, alert: str, by: str, input_series: list[dict], at: dict[str, list[str]]):
    """Run promtool on the shipped rules over ``input_series``; at each eval time of ``at``, the
    values of label ``by`` whose ``alert`` fires must be exactly those listed."""
    checks = [{"expr": f'count by ({by}) (ALERTS{{alertname="{alert}",alertstate="firing"}})', "eval_time": when,
               "exp_samples": [{"labels": f'{{{by}="{value}"}}', "value": 1} for value in values]}
              for when, values in at.items()]
    case = {"rule_files": [os.path.abspath(RULES)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": input_series, "promql_expr_test": checks}]}
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{alert}:\n{result.stdout}{result.stderr}"


def test_huge_page_coverage_low_fires_for_a_large_served_table_mostly_on_small_pages(prometheus_binaries, tmp_path):
    _, promtool = prometheus_binaries
    nodes = (node("large-4k", 2 * GIB, 0.25 * GIB, ready=True)  # 12.5% on huge pages: fires
             + node("large-huge", 2 * GIB, 2 * GIB, ready=True)
             + node("large-half", 2 * GIB, 1 * GIB, ready=True)  # 50%: the threshold, not below it
             + node("small-4k", 512 << 20, 0, ready=True)  # under 1 GiB: never
             + node("loading", 2 * GIB, 0, ready=False))  # measured once ready: not yet
    firing(promtool, tmp_path, "EngramdHugePageCoverageLow", "instance", nodes,
           {"14m": [], "16m": ["large-4k"], "40m": ["large-4k"]})


def test_gather_budget_waits_long_fires_for_a_client_waiting_most_of_its_thread_time(prometheus_binaries, tmp_path):
    _, promtool = prometheus_binaries
    clients = (gather_client("starved", threads=15, waited_share=0.8)
               + gather_client("sharing", threads=15, waited_share=0.3)  # busy ranks share tokens: fine
               + gather_client("alone", threads=15, waited_share=0.0))
    # A 5-minute rate over a counter that began at 0 reads low until it spans 5 minutes of samples
    # (Prometheus divides by the whole window), so "starved" crosses 0.5 after 2-4 minutes; then
    # 10 minutes pending.
    firing(promtool, tmp_path, "EngramdGatherBudgetWaitsLong", "client", clients,
           {"9m": [], "16m": ["starved"], "40m": ["starved"]})


def test_hot_cache_hit_rate_low_fires_only_for_a_configured_cache_that_misses(prometheus_binaries, tmp_path):
    _, promtool = prometheus_binaries
    clients = (cache_client("cold", GIB, hits_per_minute=600, misses_per_minute=60000)  # 1% hits: fires
               + cache_client("warm", GIB, hits_per_minute=30000, misses_per_minute=30000)
               + cache_client("idle", GIB, hits_per_minute=0, misses_per_minute=0)  # nothing looked up
               + cache_client("off", 0, hits_per_minute=0, misses_per_minute=0)  # no cache reports zeros
               # ... and were it to count every row it looks up as a miss, it still has no cache to alert on
               + cache_client("off-counting", 0, hits_per_minute=0, misses_per_minute=60000))
    firing(promtool, tmp_path, "EngramdHotCacheHitRateLow", "client", clients,
           {"29m": [], "32m": ["cold"], "40m": ["cold"]})
