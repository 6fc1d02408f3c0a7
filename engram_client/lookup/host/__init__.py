"""The host lookup path: C threads gather rows into pinned staging (the engine in ``engine/``, one ``.c``
per subsystem with the ``.h`` others may call, laid out in ``engine/common.h``; built as
``engram_client.lookup.host._host_gather``), the copy engine moves them, ``dequant_kernel.py``
dequantizes them in HBM; ``host_lookup.py`` launches it all.
The HBM row cache in front of the gather is ``engram_client.lookup.cache``, shared with the UVA path.

Must not import: ``engram_client.lookup.table``, ``engram_client.lookup.layer_table`` (the dispatch above
it), ``engram_client.lookup.uva``.

The dequant kernel shares the row fetch with the UVA kernel and the cache (``lookup/row_fetch.py``)
and launches through ``lookup/compiled_launch.py``; nothing of the UVA path is used here.
"""
