"""The hashing section of a table file: what a rank needs to turn token ids into rows.

A table loaded from a checkpoint with a tokenizer carries, beside its rows, the
compressed-vocabulary map (one int32 per token id, at ``map_offset``) and, in the
header JSON, the facts the hash needs: the compressed pad id, the n-gram size, the
layer ids and each layer's multipliers.  The multipliers are stored, not re-derived,
so a rank depends on no random-number generator; ``MULTIPLIER_RULE`` records how the
daemon derived them (DeepSeek's Engram reference).  Head sizes (the primes) and head
offsets are the layers' own layout.

Owns the section's schema and its checks; it imports neither torch nor a tokenizer
library, since both the daemon and the client read it.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .errors import TableFileError

INT64_MAX = (1 << 63) - 1
SEED_STRIDE = 10007  # DeepSeek's PRIME_1: layer L's generator is seeded with 10007 * L
MULTIPLIER_RULE = "2 * numpy.random.default_rng(10007 * layer_id).integers(0, max(1, (2**63 - 1) // V // 2), " \
                  "size=max_ngram, dtype=int64) + 1"


def ngram_multipliers(layer_id: int, max_ngram: int, compressed_vocab: int) -> tuple[int, ...]:
    """Layer ``layer_id``'s odd multipliers, k = 0 (the current token) first.  Each is below
    INT64_MAX // V, so id * multiplier never overflows int64 for a compressed id below V."""
    rng = np.random.default_rng(SEED_STRIDE * layer_id)
    bound = max(1, INT64_MAX // compressed_vocab // 2)
    drawn = rng.integers(0, bound, size=max_ngram, dtype=np.int64)
    return tuple(int(2 * r + 1) for r in drawn)


def map_digest(token_map: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(token_map, dtype="<i4").tobytes()).hexdigest()[:32]


@dataclass(frozen=True)
class HashingSection:
    vocab: int  # token ids the map covers: [0, vocab)
    compressed_vocab: int
    pad_token_id: int  # before compression, as the config states it
    pad_id: int  # compressed: what positions before a sequence's start hash as
    max_ngram: int
    layer_ids: tuple[int, ...]
    multipliers: tuple[tuple[int, ...], ...]  # per layer in layer_ids order, max_ngram each
    map_sha256: str
    map_offset: int = 0  # byte offset of the int32 map in the table file; set by TableHeader.plan
    token_map: np.ndarray | None = field(default=None, compare=False, repr=False)  # the writer's copy

    @classmethod
    def build(cls, token_map: np.ndarray, compressed_vocab: int, pad_token_id: int, max_ngram: int,
              layer_ids: tuple[int, ...]) -> "HashingSection":
        token_map = np.ascontiguousarray(token_map, dtype=np.int32)
        if not 0 <= pad_token_id < token_map.size:
            raise ValueError(f"pad token id {pad_token_id} is not a token id of the {token_map.size}-token map")
        return cls(vocab=int(token_map.size), compressed_vocab=compressed_vocab, pad_token_id=pad_token_id,
                   pad_id=int(token_map[pad_token_id]), max_ngram=max_ngram, layer_ids=tuple(layer_ids),
                   multipliers=tuple(ngram_multipliers(layer, max_ngram, compressed_vocab) for layer in layer_ids),
                   map_sha256=map_digest(token_map), token_map=token_map)

    @property
    def map_bytes(self) -> int:
        return self.vocab * 4

    def placed(self, offset: int) -> "HashingSection":
        return replace(self, map_offset=offset)

    def to_json(self) -> dict[str, Any]:
        return {"vocab": self.vocab, "compressed_vocab": self.compressed_vocab, "pad_token_id": self.pad_token_id,
                "pad_id": self.pad_id, "max_ngram": self.max_ngram, "layer_ids": list(self.layer_ids),
                "multipliers": [list(m) for m in self.multipliers], "multiplier_rule": MULTIPLIER_RULE,
                "map_sha256": self.map_sha256, "map_offset": self.map_offset, "map_dtype": "int32le"}

    @classmethod
    def from_json(cls, raw: Any, where: str) -> "HashingSection | None":
        if raw is None:
            return None
        try:
            section = cls(vocab=int(raw["vocab"]), compressed_vocab=int(raw["compressed_vocab"]),
                          pad_token_id=int(raw["pad_token_id"]), pad_id=int(raw["pad_id"]),
                          max_ngram=int(raw["max_ngram"]), layer_ids=tuple(int(x) for x in raw["layer_ids"]),
                          multipliers=tuple(tuple(int(m) for m in row) for row in raw["multipliers"]),
                          map_sha256=str(raw["map_sha256"]), map_offset=int(raw["map_offset"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise TableFileError(f"{where}: damaged hashing section: {type(exc).__name__}: {exc}") from exc
        section.check(where)
        return section

    def check(self, where: str) -> None:
        """Refuse a section whose hash could overflow int64 or index outside its map."""
        problems = []
        if not 1 <= self.compressed_vocab <= self.vocab:
            problems.append(f"compressed_vocab {self.compressed_vocab} is not within [1, {self.vocab}]")
        if not (0 <= self.pad_id < self.compressed_vocab and 0 <= self.pad_token_id < self.vocab):
            problems.append(f"pad id {self.pad_token_id} -> {self.pad_id} is outside the vocabularies")
        if self.max_ngram < 2 or len(self.multipliers) != len(self.layer_ids) or \
                any(len(row) != self.max_ngram for row in self.multipliers):
            problems.append(f"{len(self.multipliers)} multiplier rows for layers {list(self.layer_ids)}, "
                            f"max_ngram {self.max_ngram}")
        limit = INT64_MAX // max(self.compressed_vocab, 1)
        if any(m <= 0 or m % 2 == 0 or m > limit for row in self.multipliers for m in row):
            problems.append(f"a multiplier is not odd, positive and at most {limit}")
        if problems:
            raise TableFileError(f"{where}: hashing section: {'; '.join(problems)}")

    def read_map(self, buffer: np.ndarray, where: str) -> np.ndarray:
        """The int32 map from the table's bytes (a copy), checked against the header."""
        token_map = np.frombuffer(buffer, dtype="<i4", count=self.vocab).astype(np.int32)
        if map_digest(token_map) != self.map_sha256:
            raise TableFileError(f"{where}: token map does not match its digest {self.map_sha256}")
        if token_map.size and (int(token_map.min()) < 0 or int(token_map.max()) >= self.compressed_vocab):
            raise TableFileError(f"{where}: token map has compressed ids outside [0, {self.compressed_vocab})")
        return token_map
