"""Prometheus metrics for the daemon, served on --metrics-port.

Gauges are read at scrape time from the status snapshot the server thread last built
(never from the live lease registry, which that thread changes meanwhile); counters
are bumped where things happen: requests by operation and refusals by operation and
error code (server.py), lease expiries and reload outcomes (daemon/state_machine.py), re-adoptions
(load_job.py) and bytes loaded (the load threads, through the generation's progress).
The process's own figures (start time, open descriptors against the limit, memory)
come from prometheus_client's process collector under the same prefix.

Every label value comes from a closed set (the protocol's operations, the exception
tree's codes, two outcomes), never from what a peer sends, so no peer can grow the
number of series.  deploy/observability/ holds the dashboard and alerting rules that
read these; a name changed here must change there (tests/integration/test_prometheus.py).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, ProcessCollector, start_http_server
from prometheus_client.core import GaugeMetricFamily

from engram_client.core.protocol import FAILED, LOADING, OPERATIONS, STATES

from .budget_metrics import budget_families
from .cache_metrics import cache_families

PREFIX = "engramd"
NO_OPERATION = "invalid"  # the op label of a request refused before it named a known operation
RELOAD_OUTCOMES = ("served", "failed")


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
        yield GaugeMetricFamily("engramd_table_bytes", "Size of the served table file (one replica's)",
                                value=status["table_bytes"])
        yield GaugeMetricFamily("engramd_load_done_bytes", "Bytes loaded so far (served generation)",
                                value=status["load"]["done_bytes"])
        yield GaugeMetricFamily("engramd_load_total_bytes", "Bytes to load (served generation)",
                                value=status["load"]["total_bytes"])
        yield GaugeMetricFamily("engramd_clients", "Clients holding a lease", value=status["clients_total"])
        reload = status["reload"] or {"state": None, "load": {"done_bytes": 0, "total_bytes": 0}}
        yield GaugeMetricFamily("engramd_reload_loading", "1 while a reload loads beside the served table",
                                value=1.0 if reload["state"] == LOADING else 0.0)
        yield GaugeMetricFamily("engramd_reload_failed", "1 while the last reload has failed (the served "
                                "generation goes on; status says why)", value=1.0 if reload["state"] == FAILED else 0.0)
        yield GaugeMetricFamily("engramd_reload_done_bytes", "Bytes a reload has loaded so far (0 without one)",
                                value=reload["load"]["done_bytes"])
        yield GaugeMetricFamily("engramd_reload_total_bytes", "Bytes a reload loads (0 without one)",
                                value=reload["load"]["total_bytes"])
        pages = status.get("huge_pages") or {}
        yield GaugeMetricFamily("engramd_table_huge_page_bytes", "Bytes of the served table on huge pages (measured "
                                "once it is ready)", value=pages.get("huge_bytes", 0))
        yield from replica_families(status.get("replicas") or [])
        yield from budget_families(status)
        yield from cache_families(status)


def replica_families(replicas: list[dict]):
    """Per-replica figures, labelled by NUMA node ("any": the one table, bound to no node); the
    labels come from the daemon's own configuration, never from a peer."""
    size = GaugeMetricFamily("engramd_replica_bytes", "Size of each copy of the served table (--numa-replicas: "
                             "one per NUMA node)", labels=["node"])
    huge = GaugeMetricFamily("engramd_replica_huge_page_bytes", "Bytes of each copy of the served table on huge "
                             "pages", labels=["node"])
    for replica in replicas:
        node = "any" if replica.get("node") is None else str(replica["node"])
        size.add_metric([node], replica.get("bytes") or 0)
        huge.add_metric([node], (replica.get("huge_pages") or {}).get("huge_bytes", 0))
    yield size
    yield huge


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("engramd_requests", "Requests answered, by operation", ["op"], registry=self.registry)
        self.errors = Counter("engramd_request_errors", "Requests refused, by operation and error code",
                              ["op", "code"], registry=self.registry)
        self.lease_expiries = Counter("engramd_lease_expiries", "Leases dropped for want of a heartbeat",
                                      registry=self.registry)
        self.readoptions = Counter("engramd_readoptions", "Tables re-adopted from a predecessor at start",
                                   registry=self.registry)
        self.reloads = Counter("engramd_reloads", "Reloads finished, by outcome (served, failed)", ["outcome"],
                               registry=self.registry)
        self.load_bytes = Counter("engramd_load_bytes", "Bytes written into table files by loads and reloads "
                                  "(a re-adopted table writes none)", registry=self.registry)
        # Known label values start at 0, so a rate reads 0 before the first event rather than nothing.
        for op in OPERATIONS:
            self.requests.labels(op=op)
        for outcome in RELOAD_OUTCOMES:
            self.reloads.labels(outcome=outcome)
        ProcessCollector(namespace=PREFIX, registry=self.registry)

    def reload_finished(self, generation, outcome: str) -> None:
        """Count ``generation``'s outcome if the reload operation started it (a first load is no reload)."""
        if generation.by_reload:
            self.reloads.labels(outcome=outcome).inc()

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

    requests = errors = lease_expiries = readoptions = reloads = load_bytes = _Counter()

    def reload_finished(self, generation, outcome: str) -> None:
        pass
