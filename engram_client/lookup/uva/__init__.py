"""The UVA lookup path: a Triton kernel reads rows over PCIe itself (``lookup_kernel.py``),
``uva_lookup.py`` launches it, and the hot-row cache (``hot_rows.py``) keeps the hottest rows in GPU
memory for it.

Must not import: ``engram_client.lookup.table``, ``engram_client.lookup.layer_table``, ``engram_client.lookup.host``.
"""
