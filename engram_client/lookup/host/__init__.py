"""The host lookup path: C threads gather rows into pinned staging (the engine in ``engine/``, one ``.c``
per subsystem with the ``.h`` others may call, laid out in ``engine/common.h``; built as
``engram_client.lookup.host._host_gather``), the copy engine moves them, ``dequant_kernel.py``
dequantizes them in HBM; ``host_lookup.py`` launches it all.
``hot_cache.py`` (with ``hot_cache_kernels.py``) is the HBM hot-row cache in front of the gather.

Must not import: ``engram_client.lookup.table``, ``engram_client.lookup.layer_table`` (the dispatch above
it), ``engram_client.lookup.uva.uva_lookup``, ``engram_client.lookup.uva.hot_rows``.

The dequant kernel shares one Triton helper with the UVA kernel (its row fetch, in the UVA path's
``lookup_kernel.py``); nothing else of that path is used here.
"""
