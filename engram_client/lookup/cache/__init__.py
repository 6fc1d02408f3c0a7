"""The HBM row cache both lookup paths serve from, one a layer table: ``row_cache.py`` (HbmRowCache:
its two parts, their sizes, the fixed part's load, the disarm rule), ``kernels.py`` (classify, serve,
insert, move: the policy, kept exact in stream order) and ``layer_caches.py`` (one cache a layer from
the client's ``hot_cache_bytes``, and the heartbeat's counters).  The host path (``host/host_lookup.py``)
fetches the misses with its gather, the UVA path (``uva/cached_lookup.py``) with a kernel of its own.

Must not import: ``engram_client.lookup.table``, ``engram_client.lookup.layer_table``,
``engram_client.lookup.host.host_lookup``, ``engram_client.lookup.uva.uva_lookup``,
``engram_client.lookup.uva.cached_lookup``.

From ``lookup/`` it takes the parts every path's kernels share: ``row_fetch.py`` (a row's
dequantization) and ``compiled_launch.py`` (launches without the JIT's per-call binding).
"""
