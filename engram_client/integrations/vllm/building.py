"""The ParallelEngramEmbedding vLLM is building, while it builds it: what EngramdStorage needs to know.

vLLM builds the storage inside ``ParallelEngramEmbedding.__init__`` (``_allocate_weights`` calls
``DPSharedEngramStorage(num_rows, dim, block_size, group)``), and those four arguments say
neither which layer nor which rows.  The embedding does (``vocab_start_idx``, ``head_start``,
... are set before that call), and so does its ``head_sizes`` argument, which vLLM does not
keep: every head's size is a prime no other head has, so the sizes name the layer.  The
wrapped ``__init__`` (embedding.py) keeps both here, per thread, for the duration of the call.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from engram_client import IntegrationError

_local = threading.local()


@dataclass(frozen=True)
class Building:
    embedding: Any  # vLLM's ParallelEngramEmbedding, its shard fields already set
    head_sizes: tuple[int, ...]


@contextmanager
def building(embedding: Any, head_sizes: tuple[int, ...]) -> Iterator[None]:
    outer = getattr(_local, "current", None)
    _local.current = Building(embedding, head_sizes)
    try:
        yield
    finally:
        _local.current = outer


def under_construction() -> Building:
    current = getattr(_local, "current", None)
    if current is None:
        raise IntegrationError("DPSharedEngramStorage was built outside ParallelEngramEmbedding.__init__: engramd's "
                               "plugin only serves the storage vLLM's embedding builds for itself")
    return current
