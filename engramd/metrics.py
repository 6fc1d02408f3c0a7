"""Prometheus metrics for the daemon, served on --metrics-port.

Gauges are read at scrape time from the status snapshot the server thread last built
(never from the live lease registry, which that thread changes meanwhile); counters
are bumped where things happen: requests by operation and by error code (server.py),
lease expiries (daemon.py) and re-adoptions (load_job.py).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import GaugeMetricFamily

from engram_client.core.protocol import LOADING, STATES


class DaemonCollector:
    def __init__(self, daemon):
        self.daemon = daemon

    def collect(self):
        status = self.daemon.snapshot()  # built on the server thread; the live lease registry is not ours to walk
        state = GaugeMetricFamily("engramd_state", "1 for the daemon's current state", labels=["state"])
        for name in STATES:
            state.add_metric([name], 1.0 if status["state"] == name else 0.0)
        yield state
        yield GaugeMetricFamily("engramd_generation", "Table generation being served", value=status["generation"])
        yield GaugeMetricFamily("engramd_table_bytes", "Size of the served table file", value=status["table_bytes"])
        yield GaugeMetricFamily("engramd_load_done_bytes", "Bytes loaded so far (served generation)",
                                value=status["load"]["done_bytes"])
        yield GaugeMetricFamily("engramd_load_total_bytes", "Bytes to load (served generation)",
                                value=status["load"]["total_bytes"])
        yield GaugeMetricFamily("engramd_clients", "Clients holding a lease", value=status["clients_total"])
        reload = status["reload"]
        yield GaugeMetricFamily("engramd_reload_loading", "1 while a reload loads beside the served table",
                                value=1.0 if reload and reload["state"] == LOADING else 0.0)
        pages = status.get("huge_pages") or {}
        yield GaugeMetricFamily("engramd_table_huge_page_bytes", "Bytes of the served table on huge pages (measured "
                                "once it is ready)", value=pages.get("huge_bytes", 0))
        yield from budget_families(status)


def budget_families(status: dict):
    """The node's gather budget per group, and each client's share as its heartbeats report it."""
    groups = (status.get("gather_budget") or {}).get("groups", [])
    tokens = GaugeMetricFamily("engramd_gather_budget_tokens", "Tokens (CPUs) of a group of the node's gather "
                               "budget", labels=["group", "node", "cpus"])
    held = GaugeMetricFamily("engramd_gather_budget_held", "Tokens of a group held now (the kernel's lock table)",
                             labels=["group", "node"])
    for group in groups:
        tokens.add_metric([str(group["group"]), str(group["node"]), group["cpus"]], group["tokens"])
        held.add_metric([str(group["group"]), str(group["node"])], group["locked"])
    yield tokens
    yield held
    families = {key: GaugeMetricFamily(f"engramd_client_gather_{key}", text, labels=["client", "rank", "cpus"])
                for key, text in (("threads", "Gather threads of a client's pool (on the budget)"),
                                  ("rows", "Rows a client has gathered on the budget (its heartbeats' count)"),
                                  ("wait_seconds", "Thread-seconds a client's gather threads waited for tokens"),
                                  ("overdrafts", "Times a client gathered without a token, the tokens kept from it"))}
    for client in status.get("clients", []):
        budget = client.get("budget")
        if not budget:
            continue
        labels = [client["id"], "" if client.get("rank") is None else str(client["rank"]), budget.get("cpus", "")]
        for key, field in (("threads", "threads"), ("rows", "rows"), ("wait_seconds", "wait_s"),
                           ("overdrafts", "overdraft")):
            families[key].add_metric(labels, budget.get(field, 0))
    yield from families.values()


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("engramd_requests", "Requests answered, by operation", ["op"], registry=self.registry)
        self.errors = Counter("engramd_request_errors", "Requests refused, by error code", ["code"],
                              registry=self.registry)
        self.lease_expiries = Counter("engramd_lease_expiries", "Leases dropped for want of a heartbeat",
                                      registry=self.registry)
        self.readoptions = Counter("engramd_readoptions", "Tables re-adopted from a predecessor at start",
                                   registry=self.registry)

    def watch(self, daemon) -> None:
        self.registry.register(DaemonCollector(daemon))

    def serve(self, port: int, address: str) -> None:
        start_http_server(port, addr=address, registry=self.registry)


class NoMetrics:
    """Stands in when --metrics-port is not given, so call sites need no conditionals."""

    class _Counter:
        def labels(self, *args, **kwargs):
            return self

        def inc(self, amount: float = 1.0) -> None:
            pass

    requests = errors = lease_expiries = readoptions = _Counter()
