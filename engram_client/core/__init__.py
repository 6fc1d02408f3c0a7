"""The torch-free core both sides share: wire protocol, table-file format (and its
hashing section), layout, errors, demo geometry.

engramd imports only this package and ``engram_client.connection``; nothing here may
import torch (tests/unit/test_torch_free.py enforces it).
"""
