"""Each client's HBM row cache as Prometheus gauges, as its heartbeats report it (status["clients"][i]["cache"],
engramd/reporting/cache_report.py): hits, misses, rows fetched from host memory, HBM bytes, rows held."""
from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

FAMILIES = (("hits", "hits", "Row lookups a client's HBM cache served (its heartbeats' total over its layers)"),
            ("misses", "misses", "Row lookups a client's HBM cache missed, served from host memory"),
            ("fetched_rows", "fetched", "Rows a client fetched from host memory on its cached lookups"),
            ("bytes", "bytes", "HBM bytes of a client's row cache"),
            ("fixed_rows", "fixed_rows", "Rows of a client's cache held from the served hot-row list"),
            ("recent_rows", "recent_rows", "Rows of a client's cache held by recency"))


def cache_families(status: dict):
    families = {key: GaugeMetricFamily(f"engramd_client_cache_{key}", text, labels=["client", "rank"])
                for key, _, text in FAMILIES}
    for client in status.get("clients", []):
        cache = client.get("cache")
        if not cache:
            continue
        labels = [client["id"], "" if client.get("rank") is None else str(client["rank"])]
        for key, field, _ in FAMILIES:
            families[key].add_metric(labels, cache.get(field, 0))
    yield from families.values()
