"""The CPU hash: the C extension when it was built, else the numpy version.

Both take numpy views of the caller's tensors and fill the output in place; the
extension releases the GIL, so a heartbeat thread runs while it hashes.
"""
from __future__ import annotations

import logging

from .numpy_hash import hash_rows_numpy

log = logging.getLogger("engram_client")

try:
    from ._ngram_hash import hash_rows as _hash_rows_c
except ImportError:  # built without a compiler: correct, about four times slower
    _hash_rows_c = None


def cpu_backend() -> str:
    return "c" if _hash_rows_c is not None else "numpy"


def hash_rows_cpu(tokens, starts, history, token_map, pad_id, multipliers, primes, offsets, max_ngram,
                  heads_per_order, out, backend: str | None = None) -> int:
    """Fill ``out`` [T, L, heads] (int32 or int64); -1, or the index of the first bad id."""
    if (backend or cpu_backend()) == "c":
        if _hash_rows_c is None:
            raise RuntimeError("the C hash extension engram_client.hashing._ngram_hash was not built")
        return _hash_rows_c(tokens, starts, history, token_map, pad_id, multipliers, primes, offsets, max_ngram,
                            heads_per_order, out)
    return hash_rows_numpy(tokens, starts, history, token_map, pad_id, multipliers, primes, offsets, max_ngram,
                           heads_per_order, out)
