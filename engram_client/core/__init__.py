"""The torch-free core both sides share: wire protocol, table-file format (and its
hashing section), layout, errors, demo geometry.

engramd imports only this package and ``engram_client.attach.connection``; nothing here may
import torch (tests/unit/test_torch_free.py enforces it).

Must not import: ``engram_client.attach``, ``engram_client.lookup``, ``engram_client.hashing``,
``engram_client.tools``, ``engram_client.integrations``, ``engram_client.client``,
``engram_client.client_state``, ``engram_client.token_rows``, ``engramd``.
"""
