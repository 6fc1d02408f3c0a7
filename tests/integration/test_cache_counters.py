"""A client's HBM row-cache counters (heartbeat ``cache``, protocol 1.4) through the real socket to
``engramd status`` (JSON and text) and /metrics; a bad report is a bad_request reply, and the daemon
goes on serving.  The test client is this process, talking raw protocol over the daemon's ipc socket."""
from __future__ import annotations

import json
import os
import urllib.request

import pytest
from click.testing import CliRunner
from waiting import free_port, wait_for

from engram_client.core.errors import RequestError
from engramd.cli.main import main

COUNTERS = {"hits": 900, "misses": 100, "fetched": 95, "bytes": 3 << 20, "fixed_rows": 4000, "recent_rows": 2000}


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {line.rpartition(" ")[0]: float(line.rpartition(" ")[2]) for line in text.splitlines()
            if line and not line.startswith("#")}


def attach(daemon, rank: int) -> dict:
    return daemon.connection.request("attach", {"pid": os.getpid(), "rank": rank, "device": "cuda:0"})


def heartbeat(daemon, lease: dict, **extra) -> dict:
    return daemon.connection.request("heartbeat", {"client_id": lease["client_id"], "secret": lease["lease_secret"],
                                                   **extra})


def test_cache_counters_reach_status_and_metrics(daemon_factory):
    port = free_port()
    daemon = daemon_factory("--metrics-port", str(port))
    daemon.wait_state("ready")
    cached, plain = attach(daemon, 3), attach(daemon, 4)
    heartbeat(daemon, cached, cache=COUNTERS)
    heartbeat(daemon, plain)
    clients = {c["id"]: c for c in daemon.status()["clients"]}
    assert clients[cached["client_id"]]["cache"] == COUNTERS
    assert clients[plain["client_id"]]["cache"] is None
    heartbeat(daemon, cached)  # a heartbeat without counters keeps the last ones
    assert {c["id"]: c for c in daemon.status()["clients"]}[cached["client_id"]]["cache"] == COUNTERS

    result = CliRunner().invoke(main, ["status", "--socket", daemon.endpoint])
    assert result.exit_code == 0, result.output
    assert ("row cache: 90.0% hits (900 hits, 100 misses), 95 rows fetched from host memory; 3.0 MiB of HBM "
            "holding 4,000 listed and 2,000 recent rows") in result.output
    as_json = json.loads(CliRunner().invoke(main, ["status", "--socket", daemon.endpoint, "--json"]).output)
    assert {c["id"]: c["cache"] for c in as_json["clients"]}[cached["client_id"]] == COUNTERS

    labels = f'client="{cached["client_id"]}",rank="3"'
    wait_for(lambda: f"engramd_client_cache_hits{{{labels}}}" in scrape(port), "the cache gauges in /metrics", 10)
    samples = scrape(port)
    for name, field in (("hits", "hits"), ("misses", "misses"), ("fetched_rows", "fetched"), ("bytes", "bytes"),
                        ("fixed_rows", "fixed_rows"), ("recent_rows", "recent_rows")):
        assert samples[f"engramd_client_cache_{name}{{{labels}}}"] == COUNTERS[field], name
    assert not [key for key in samples if key.startswith("engramd_client_cache") and plain["client_id"] in key]


BAD_REPORTS = [
    ([1, 2], "must be a map of the cache counters"),
    ({"hits": 1, "bogus": 2}, "unknown field 'bogus'"),
    ({"hits": -1}, "'hits' must be an integer between 0 and 2\\*\\*63"),
    ({"misses": 1.5}, "'misses' must be an integer"),
    ({"fetched": True}, "'fetched' must be an integer"),
    ({"bytes": 2**63}, "'bytes' must be an integer"),
    ({f"k{i}": 0 for i in range(50)}, "must be a map of the cache counters"),
]


def test_a_bad_cache_report_is_refused_and_kept_out(demo_daemon):
    lease = attach(demo_daemon, 0)
    heartbeat(demo_daemon, lease, cache={"hits": 1})
    for cache, message in BAD_REPORTS:
        with pytest.raises(RequestError, match=message) as refused:
            heartbeat(demo_daemon, lease, cache=cache)
        assert refused.value.code == "bad_request"
    status = demo_daemon.status()
    assert status["state"] == "ready" and status["clients"][0]["cache"] == {"hits": 1}
