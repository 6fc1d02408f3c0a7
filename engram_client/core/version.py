"""The package version, in one place: pyproject reads it, engramd and engram_client re-export it.

The wire protocol is versioned apart from this (core/protocol.py), as is the table file (core/table_file.py).
"""
__version__ = "0.1.0"
