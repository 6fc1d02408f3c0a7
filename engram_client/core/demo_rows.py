"""The embedded demo table: deterministic rows computed from (seed, layer, row).

``engramd serve`` without a checkpoint fills its table from this function, and the
demo ranks recompute the expected rows from it to check what they looked up, so
neither side needs a checkpoint on disk.  Values come from a counter-based hash
(splitmix64), so any row can be produced on its own, in any order.
"""
from __future__ import annotations

import numpy as np

from .layout import QUANT_BLOCK, EngramConfig, packed_row_bytes

DEMO_VOCAB_SIZE = 2000


def demo_config(vocab_size: int = DEMO_VOCAB_SIZE, layer_ids=(1, 14), max_ngram: int = 4,
                n_heads: int = 8, head_dim: int = 256) -> EngramConfig:
    """V4.1's shape (two layers, orders 2..4, 8 heads, 256-wide rows) at a small vocab size."""
    from .layout import head_sizes
    probe = EngramConfig(layer_ids=tuple(layer_ids), num_embeddings=(0,) * len(layer_ids), max_ngram=max_ngram,
                         n_heads=n_heads, head_dim=head_dim, vocab_sizes=(vocab_size,) * (max_ngram - 1),
                         source="demo")
    rows = tuple(sum(sizes) for sizes in head_sizes(probe))
    return EngramConfig(layer_ids=probe.layer_ids, num_embeddings=rows, max_ngram=max_ngram, n_heads=n_heads,
                        head_dim=head_dim, vocab_sizes=probe.vocab_sizes, source="demo")


def demo_vocab_for_table_bytes(target_bytes: int) -> int:
    """The demo vocab size whose table is about ``target_bytes``: each head has about vocab rows,
    and demo_config's table has layers x orders x heads of them, each row packed."""
    shape = demo_config(vocab_size=1)
    heads = len(shape.layer_ids) * (shape.max_ngram - 1) * shape.n_heads
    return max(1000, target_bytes // (heads * packed_row_bytes(shape.head_dim)))


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def demo_rows(seed: int, layer: int, rows: np.ndarray, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """FP8 bytes [n, head_dim] and UE8M0 bytes [n, head_dim/32] (both uint8) for ``rows``."""
    rows = np.asarray(rows, dtype=np.uint64).reshape(-1, 1)
    words_per_row = head_dim // 8 + 1  # 8 bytes of hash per word; the last word feeds the scales
    base = _splitmix64(np.array([(seed & 0xFFFFFFFF) << 32 | (layer & 0xFFFFFFFF)], dtype=np.uint64))[0]
    counters = rows * np.uint64(words_per_row) + np.arange(words_per_row, dtype=np.uint64)
    words = _splitmix64(counters ^ base)
    raw = words.view(np.uint8).reshape(rows.shape[0], words_per_row * 8)
    weight = np.ascontiguousarray(raw[:, :head_dim])
    # 0x7F / 0xFF are E4M3 NaN; the demo keeps every value finite.
    weight[(weight & 0x7F) == 0x7F] ^= 0x01
    scale = (120 + raw[:, head_dim:head_dim + head_dim // QUANT_BLOCK] % 12).astype(np.uint8)
    return weight, scale
