"""The dashboard's row for each client's HBM hot-row cache.

Per client (labels client, rank), as its heartbeats report them: rows looked up that the cache
held (hits) and did not (misses), rows it fetched from the host table, its bytes of HBM, and the
rows it holds from a frequency list (fixed) and learned from recent lookups (recent).  A client
with the cache off reports zeros, so its hit rate reads 0 (the clamp keeps a division by no
lookups at 0 rather than NaN); Cache bytes tells those apart from a cache that misses.
"""
from __future__ import annotations

from panel_model import RATE, Panel, Query, Row, sel

CLIENT = "{{instance}} rank {{rank}} ({{client}})"


def _rate(metric: str) -> str:
    return f"rate({sel(metric)}[{RATE}])"


HITS, MISSES = _rate("engramd_client_cache_hits"), _rate("engramd_client_cache_misses")

CACHE_ROWS = (
    Row("HBM hot-row cache", (
        Panel("Cache hit rate", "percentunit",
              "The share of looked-up rows each client's HBM cache held, and of all a node's clients together. "
              "It depends on the ids: skewed (Zipf) traffic caches well, uniform ids not at all. Near 0 with a "
              "cache configured (Cache bytes above 0): its frequency list was built from other traffic, or none "
              "was served and the recent rows turn over faster than they are reused: build the list from this "
              "deployment's ids, or give the HBM back by turning the cache off. 0 also reads for a client "
              "without a cache, or one that looked nothing up.",
              (Query(f"{HITS} / clamp_min({HITS} + {MISSES}, 1)", CLIENT),
               Query(f"sum by (job, instance) ({HITS}) / clamp_min(sum by (job, instance) ({HITS} + {MISSES}), 1)",
                     "{{instance}} all clients")),
              max=1),
        Panel("Rows fetched from host", "short",
              "Rows per second each client's cache brought into HBM from the host table. It follows the "
              "cache's refreshes; a steady high rate with a low hit rate is churn: the rows learned are evicted "
              "before they are reused, so the cache costs host gathers and PCIe without paying back: a larger "
              "cache, a frequency list that covers the hot set, or the cache off.",
              (Query(_rate("engramd_client_cache_fetched_rows"), CLIENT),)),
        Panel("Cache bytes", "bytes",
              "HBM each client's cache holds, taken from the engine's GPU memory: 0 is a client with the cache "
              "off. Clients of one engine with different sizes were started with different settings; a cache "
              "whose hit rate stays near 0 gives nothing for this memory (EngramdHotCacheHitRateLow).",
              (Query(sel("engramd_client_cache_bytes"), CLIENT),)),
        Panel("Cache rows", "short",
              "Rows each client's cache holds from its frequency list (fixed) and learned from its recent "
              "lookups (recent). Fixed 0 with a cache configured: no frequency list was served to it, so only "
              "recent rows cache; recent 0 while the client looks rows up: the cache learns nothing from its "
              "lookups, and holds only what the list gave it.",
              (Query(sel("engramd_client_cache_fixed_rows"), f"{CLIENT} fixed"),
               Query(sel("engramd_client_cache_recent_rows"), f"{CLIENT} recent"))),
    )),
)
