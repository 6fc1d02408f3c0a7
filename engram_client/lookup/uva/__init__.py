"""The UVA lookup path: a Triton kernel reads rows over PCIe itself (``lookup_kernel.py``),
``uva_lookup.py`` launches it; with the HBM row cache (``engram_client.lookup.cache``), ``cached_lookup.py``
reads only the misses' packed rows and the cache's kernels serve the call.

Must not import: ``engram_client.lookup.table``, ``engram_client.lookup.layer_table``, ``engram_client.lookup.host``.
"""
