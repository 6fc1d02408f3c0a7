"""The n-gram hash in numpy: the CPU fallback where the C extension was not built.

Same inputs and results as ``_ngram_hash.hash_rows`` (see cpu.py), computed order by
order over whole arrays.  About four times slower than the extension on 16K tokens,
since numpy's int64 remainder is a hardware division per element.
"""
from __future__ import annotations

import numpy as np


def window(tokens: np.ndarray, starts: np.ndarray, history: np.ndarray | None, token_map: np.ndarray, pad_id: int,
           max_ngram: int) -> np.ndarray:
    """Compressed ids [max_ngram, T]: row k holds each token's k-th predecessor in its sequence,
    from ``history`` (raw ids, -1 for none) or the pad id before the sequence's start."""
    count = tokens.size
    index = np.arange(count)
    seq = np.searchsorted(starts, index, side="right") - 1
    pos = index - starts[seq] if count else index
    compressed = token_map[tokens].astype(np.int64)
    out = np.empty((max_ngram, count), dtype=np.int64)
    for k in range(max_ngram):
        inside = pos >= k
        row = np.full(count, pad_id, dtype=np.int64)
        row[inside] = compressed[index[inside] - k]
        if history is not None and not inside.all():
            outside = ~inside
            raw = history[seq[outside], max_ngram - 1 + pos[outside] - k]
            row[outside] = np.where(raw < 0, pad_id, token_map[np.maximum(raw, 0)])
        out[k] = row
    return out


def hash_rows_numpy(tokens, starts, history, token_map, pad_id, multipliers, primes, offsets, max_ngram,
                    heads_per_order, out) -> int:
    """Fills ``out`` [T, L, heads]; returns -1, or the first bad id's index as hash_rows does."""
    tokens = np.asarray(tokens).astype(np.int64, copy=False)
    vocab = token_map.size
    bad = np.flatnonzero((tokens < 0) | (tokens >= vocab))
    if bad.size:
        return int(bad[0])
    if history is not None:
        bad = np.flatnonzero((history.reshape(-1) < -1) | (history.reshape(-1) >= vocab))
        if bad.size:
            return tokens.size + int(bad[0])
    x = window(tokens, starts, history, token_map, pad_id, max_ngram)
    for layer in range(multipliers.shape[0]):
        mix = x[0] * multipliers[layer, 0]
        for k in range(1, max_ngram):
            mix = mix ^ (x[k] * multipliers[layer, k])
            cols = slice((k - 1) * heads_per_order, k * heads_per_order)
            out[:, layer, cols] = mix[:, None] % primes[layer, cols] + offsets[layer, cols]
    return -1
