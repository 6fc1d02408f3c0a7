"""One HBM row cache a layer table, whichever path serves it: the budget's split between layers,
building and loading each layer's cache, and the counters a heartbeat reports over them.

``hot_cache_bytes`` means the same on both paths: the rank's HBM for the cache, split between its
layers by their (registered) rows, each layer's share split between the hot-row list's fixed part
and the recency part by ``part_sizes`` (row_cache.py).  Only the fixed part's loading differs: the
host path's gather pool copies its rows, the UVA path (which has no pool) copies them with torch.
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from .row_cache import HbmRowCache

log = logging.getLogger("engram_client")


def cache_for_layer(budget_bytes: int, layout, host_rows: torch.Tensor, row_lo: int, row_hi: int,
                    device: torch.device, pool, stream, ranked: np.ndarray | None) -> HbmRowCache:
    """One layer's cache, its fixed part loaded from ``ranked`` (the frequency list's ids for the
    layer, most frequent first; None: no list, the recency part alone); ``pool`` None: no gather pool."""
    cache = HbmRowCache(budget_bytes, layout.head_dim, layout.row_bytes, row_lo, row_hi, device, ranked)
    cache.load_fixed(pool, host_rows, row_lo, row_hi, stream)
    if cache.fixed_count:
        log.info("layer %d: hot-row cache of %.2f GiB, %d rows of the frequency list loaded in %.3f s, %d recency "
                 "slots", layout.layer, cache.nbytes / 2**30, cache.fixed_count, cache.load_seconds,
                 cache.recent_capacity)
    return cache


def cache_for_view(config, view, mapped, device: torch.device, pool, stream) -> HbmRowCache | None:
    """The cache of one layer's view of a mapped generation: its share of the client's
    ``hot_cache_bytes`` and its rows of the generation's hot-row list; None without a budget.
    The same cache on every ``lookup_path``: ``pool`` (None on the UVA path) only loads it."""
    if not config.hot_cache_bytes:
        return None
    budget = layer_budgets(config.hot_cache_bytes, {k: v.hi - v.lo for k, v in mapped.layers.items()})
    layer = view.layout.layer
    hot_list = getattr(mapped, "hot_list", None)
    ranked = hot_list.ranked(layer) if hot_list is not None and layer in hot_list.layers else None
    return cache_for_layer(budget[layer], view.layout, view.host_view, view.lo, view.hi, device, pool, stream, ranked)


def layer_budgets(total_bytes: int, rows: dict[int, int]) -> dict[int, int]:
    """A rank's cache budget split across its layers by their rows (registered ranges)."""
    whole = sum(rows.values()) or 1
    return {layer: total_bytes * count // whole for layer, count in rows.items()}


def cache_report(pool, caches) -> dict:
    """The counters a heartbeat carries (protocol 1.4): totals over the client's layers.  Hits,
    misses and rows fetched are the host gather's counts (``pool``); without a pool (the UVA path)
    they stay 0: counting them there would need a device counter read back on the heartbeat's thread."""
    hits, misses, fetched = pool.cache_counts if pool is not None else (0, 0, 0)
    described = [cache.describe() for cache in caches]
    return {"hits": hits, "misses": misses, "fetched": fetched,
            "bytes": sum(d["bytes"] for d in described), "fixed_rows": sum(d["fixed_rows"] for d in described),
            "recent_rows": sum(d["recent_rows"] for d in described)}
