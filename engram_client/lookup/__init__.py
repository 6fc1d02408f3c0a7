"""Lookups: one layer's rows as the client holds them (``layer_table.py``, which picks a path per call),
``EngramTable`` over them (``table.py``), ``LookupConfig`` (``config.py``), prefetch handles, the
out-of-range ledger, dequantization and its exact reference; one folder per path (``host/``, ``uva/``),
each with its kernels and C sources beside its launcher, and ``cache/``, the HBM row cache both serve from;
what those share sits here: ``row_fetch.py`` (a packed row to bf16 inside a Triton kernel) and
``compiled_launch.py`` (a kernel launched through its compiled runner).

Must not import: ``engram_client.attach``, ``engram_client.hashing``, ``engram_client.tools``,
``engram_client.integrations``, ``engram_client.client``, ``engram_client.client_state``,
``engram_client.token_rows``, ``engramd``.
"""
