"""An independent reference for the token hash, written from the algorithm's description
(DeepSeek's Engram reference, as issue 12 states it), in plain Python: no numpy in the
hash, no code shared with engram_client.hashing or engramd.loading.token_map.

Slow by design: one Python loop per token, layer, order and head.
"""
from __future__ import annotations

import re
import unicodedata

import numpy as np

INT64_MAX = 2**63 - 1


def normalize_key(text: str) -> str:
    """NFKC, NFD, drop every mark (categories Mn, Mc, Me), lowercase, collapse [ \\t\\r\\n]+ to a space, a lone space
    survives the strip, else strip; an empty result falls back to the text itself."""
    s = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text))
    s = "".join(ch for ch in s if not unicodedata.category(ch).startswith("M")).lower()  # Mn, Mc and Me
    s = re.sub(r"[ \t\r\n]+", " ", s)
    s = " " if s == " " else s.strip()
    return s or text


def compressed_vocabulary(decode_one, raw_token, vocab_size: int) -> tuple[list[int], int]:
    """(old id -> new id, number of new ids), ids handed out in order of first appearance."""
    key_to_new: dict[str, int] = {}
    mapping = []
    for tid in range(vocab_size):
        text = decode_one(tid)
        key = raw_token(tid) if "\ufffd" in text else normalize_key(text)
        if key not in key_to_new:
            key_to_new[key] = len(key_to_new)
        mapping.append(key_to_new[key])
    return mapping, len(key_to_new)


def multipliers(layer_id: int, max_ngram: int, compressed_vocab: int) -> list[int]:
    generator = np.random.default_rng(10007 * layer_id)
    half = max(1, (INT64_MAX // compressed_vocab) // 2)
    drawn = generator.integers(0, half, size=max_ngram, dtype=np.int64)
    return [2 * int(r) + 1 for r in drawn]


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    f = 2
    while f * f <= n:
        if n % f == 0:
            return False
        f += 1
    return True


def head_primes(layer_ids, max_ngram: int, n_heads: int, vocab_sizes) -> dict[int, list[list[int]]]:
    """Per layer, per order 2..max, the heads' primes: the next unused prime from the order's size."""
    seen: set[int] = set()
    out = {}
    for layer in layer_ids:
        orders = []
        for n in range(2, max_ngram + 1):
            heads, candidate = [], vocab_sizes[n - 2] - 1
            for _ in range(n_heads):
                candidate += 1
                while not is_prime(candidate) or candidate in seen:
                    candidate += 1
                seen.add(candidate)
                heads.append(candidate)
            orders.append(heads)
        out[layer] = orders
    return out


def sequence_rows(tokens: list[int], mapping: list[int], pad_token_id: int, layer_mults: list[int],
                  primes: list[list[int]]) -> list[list[int]]:
    """One sequence, one layer: per token, the row of every head (order then head, offsets added)."""
    pad = mapping[pad_token_id]
    x = [mapping[t] for t in tokens]
    offsets, total = [], 0
    for order in primes:
        for p in order:
            offsets.append(total)
            total += p
    rows = []
    for t in range(len(x)):
        out = []
        for n in range(2, len(layer_mults) + 1):
            mix = 0
            for k in range(n):
                token = x[t - k] if t - k >= 0 else pad
                mix ^= token * layer_mults[k]
            for p in primes[n - 2]:
                out.append(mix % p + offsets[len(out)])
        rows.append(out)
    return rows


def packed_rows(tokens: list[int], seq_starts: list[int], mapping, pad_token_id, mults_by_layer, primes_by_layer,
                layer_ids) -> np.ndarray:
    """[tokens, layers, heads] for packed sequences, each hashed on its own."""
    bounds = list(seq_starts) + [len(tokens)]
    per_layer = []
    for layer in layer_ids:
        rows = []
        for begin, end in zip(bounds, bounds[1:]):
            rows += sequence_rows(tokens[begin:end], mapping, pad_token_id, mults_by_layer[layer],
                                  primes_by_layer[layer])
        per_layer.append(rows)
    return np.array(per_layer, dtype=np.int64).transpose(1, 0, 2)
