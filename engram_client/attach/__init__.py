"""Attaching to engramd: the connection and its socket-trust check, readiness (``wait_ready``), the
read-only mapping of a table file, its CUDA registration, one mapped generation, and what a forked child
may do.  ``connection.py``, ``readiness.py`` and ``socket_trust.py`` are torch-free: the daemon imports them.

Must not import: ``engram_client.lookup``, ``engram_client.hashing``, ``engram_client.tools``,
``engram_client.integrations``, ``engram_client.client``, ``engram_client.client_state``,
``engram_client.token_rows``, ``engramd``.
"""
