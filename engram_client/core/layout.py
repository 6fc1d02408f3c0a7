"""Engram table geometry: which layers, how many rows, how rows split into heads.

DeepSeek-V4.1's published layout: for each layer in ``engram_layer_ids`` order, for
each n-gram order 2..max, for each head, the head's size is the smallest prime at
least that order's vocab size that no earlier (layer, order, head) has taken.  A
layer's rows are its heads concatenated in that order.  Each row holds
``head_dim`` FP8-E4M3 values and ``head_dim / 32`` UE8M0 scale bytes.

Owns config parsing and geometry only; it reads no tensors and touches no files
other than the config it is given.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterator

from .errors import LayoutError
from .primes import PrimeBlocks, is_prime  # noqa: F401  (is_prime: part of this module's API)

QUANT_BLOCK = 32  # values per UE8M0 scale byte
# Far above any real model (V4.1: n-grams up to 4, 8 heads, 256 wide, 2 layers, vocab 1.6e7), and
# low enough that a damaged config cannot make the layout computation run for minutes.
MAX_NGRAM, MAX_HEADS, MAX_HEAD_DIM, MAX_LAYERS, MAX_VOCAB = 32, 4096, 65536, 1024, 1 << 40
MAX_TOTAL_HEADS = 65536
CONFIG_FIELDS = ("engram_layer_ids", "engram_num_embeddings", "engram_max_ngram_size",
                 "engram_n_heads", "engram_head_dim", "engram_vocab_size")


def packed_row_bytes(head_dim: int) -> int:
    """Bytes of one packed table row: ``head_dim`` FP8-E4M3 values, then their UE8M0 scales.

    The one definition of the row the table file, the loader and the kernels share
    (V4.1: 256 + 8 = 264 bytes)."""
    return head_dim + head_dim // QUANT_BLOCK


@dataclass(frozen=True)
class EngramConfig:
    layer_ids: tuple[int, ...]
    num_embeddings: tuple[int, ...]  # one per layer, as the config states it
    max_ngram: int
    n_heads: int
    head_dim: int
    vocab_sizes: tuple[int, ...]  # one per n-gram order 2..max_ngram
    source: str = "<config>"
    # Optional: the hash's compressed vocabulary (checked against the tokenizer) and the pad
    # token id before its compression (V4.1: 99,092 and 2).
    compressed_vocab_size: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        where = self.source
        for name, value, limit in (("engram_max_ngram_size", self.max_ngram, MAX_NGRAM),
                                   ("engram_n_heads", self.n_heads, MAX_HEADS),
                                   ("engram_head_dim", self.head_dim, MAX_HEAD_DIM),
                                   ("number of engram_layer_ids", len(self.layer_ids), MAX_LAYERS)):
            if value > limit:
                raise LayoutError(f"{where}: {name} is {value}, more than the {limit} this reader accepts")
        total_heads = len(self.layer_ids) * max(self.max_ngram - 1, 0) * max(self.n_heads, 0)
        if total_heads > MAX_TOTAL_HEADS:
            raise LayoutError(f"{where}: {total_heads} heads in all (layers x orders x heads), more than the "
                              f"{MAX_TOTAL_HEADS} this reader accepts")
        if any(v > MAX_VOCAB for v in self.vocab_sizes):
            raise LayoutError(f"{where}: engram_vocab_size {max(self.vocab_sizes)} exceeds {MAX_VOCAB}")
        if not self.layer_ids:
            raise LayoutError(f"{where}: engram_layer_ids is empty")
        if len(set(self.layer_ids)) != len(self.layer_ids):
            raise LayoutError(f"{where}: engram_layer_ids {list(self.layer_ids)} repeats a layer")
        if any(layer < 0 for layer in self.layer_ids):
            raise LayoutError(f"{where}: engram_layer_ids {list(self.layer_ids)} has a negative layer id")
        if self.max_ngram < 2:
            raise LayoutError(f"{where}: engram_max_ngram_size must be at least 2, got {self.max_ngram}")
        if self.n_heads < 1:
            raise LayoutError(f"{where}: engram_n_heads must be at least 1, got {self.n_heads}")
        if self.head_dim < QUANT_BLOCK or self.head_dim % QUANT_BLOCK:
            raise LayoutError(f"{where}: engram_head_dim {self.head_dim} is not a positive multiple of {QUANT_BLOCK}")
        if len(self.vocab_sizes) != self.max_ngram - 1:
            raise LayoutError(f"{where}: engram_vocab_size has {len(self.vocab_sizes)} entries; orders 2..{self.max_ngram} need {self.max_ngram - 1}")
        if any(v < 1 for v in self.vocab_sizes):
            raise LayoutError(f"{where}: engram_vocab_size {list(self.vocab_sizes)} has a size below 1")
        if len(self.num_embeddings) != len(self.layer_ids):
            raise LayoutError(f"{where}: engram_num_embeddings has {len(self.num_embeddings)} entries for {len(self.layer_ids)} layers")
        for name, value in (("engram_compressed_vocab_size", self.compressed_vocab_size),
                            ("engram_pad_token_id", self.pad_token_id)):
            if value is not None and not 0 <= value <= MAX_VOCAB:
                raise LayoutError(f"{where}: {name} is {value}, outside [0, {MAX_VOCAB}]")

    @property
    def scale_cols(self) -> int:
        return self.head_dim // QUANT_BLOCK

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "<config>") -> "EngramConfig":
        fields = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else None
        if fields is None or "engram_layer_ids" not in fields:
            fields = raw
        missing = [name for name in CONFIG_FIELDS if name not in fields]
        if missing:
            raise LayoutError(f"{source}: missing {', '.join(missing)} (at top level or under text_config)")

        def integer(name: str, value: Any) -> int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise LayoutError(f"{source}: {name} must be an integer, got {value!r}")
            return value

        def integers(name: str, value: Any) -> tuple[int, ...]:
            if not isinstance(value, list):
                raise LayoutError(f"{source}: {name} must be a list of integers, got {value!r}")
            return tuple(integer(name, v) for v in value)

        layer_ids = integers("engram_layer_ids", fields["engram_layer_ids"])
        max_ngram = integer("engram_max_ngram_size", fields["engram_max_ngram_size"])
        num = fields["engram_num_embeddings"]
        num_embeddings = integers("engram_num_embeddings", num) if isinstance(num, list) else \
            (integer("engram_num_embeddings", num),) * len(layer_ids)
        vocab = fields["engram_vocab_size"]
        vocab_sizes = integers("engram_vocab_size", vocab) if isinstance(vocab, list) else \
            (integer("engram_vocab_size", vocab),) * min(max(max_ngram - 1, 0), MAX_NGRAM)  # checked in __post_init__
        optional = {name: None if fields.get(name) is None else integer(name, fields[name])
                    for name in ("engram_compressed_vocab_size", "engram_pad_token_id")}
        return cls(layer_ids=layer_ids, num_embeddings=num_embeddings, max_ngram=max_ngram,
                   n_heads=integer("engram_n_heads", fields["engram_n_heads"]),
                   head_dim=integer("engram_head_dim", fields["engram_head_dim"]),
                   vocab_sizes=vocab_sizes, source=source,
                   compressed_vocab_size=optional["engram_compressed_vocab_size"],
                   pad_token_id=optional["engram_pad_token_id"])

    @classmethod
    def from_file(cls, path: str) -> "EngramConfig":
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except FileNotFoundError as exc:
            raise LayoutError(f"{path}: config.json not found") from exc
        except (OSError, ValueError, RecursionError) as exc:
            raise LayoutError(f"{path}: cannot read config: {type(exc).__name__}: {exc}") from exc
        if not isinstance(raw, dict):
            raise LayoutError(f"{path}: config must be a JSON object")
        return cls.from_dict(raw, source=os.fspath(path))


@dataclass(frozen=True)
class LayerLayout:
    layer: int
    head_dim: int
    head_sizes: tuple[int, ...]
    head_offsets: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        offsets, total = [], 0
        for size in self.head_sizes:
            offsets.append(total)
            total += size
        object.__setattr__(self, "head_offsets", tuple(offsets))

    @property
    def rows(self) -> int:
        return sum(self.head_sizes)

    @property
    def scale_cols(self) -> int:
        return self.head_dim // QUANT_BLOCK

    @property
    def row_bytes(self) -> int:
        """Bytes of one packed row: FP8 values, then their UE8M0 scales."""
        return packed_row_bytes(self.head_dim)

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "rows": self.rows, "head_dim": self.head_dim,
                "head_sizes": list(self.head_sizes)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "LayerLayout":
        return cls(layer=int(raw["layer"]), head_dim=int(raw["head_dim"]),
                   head_sizes=tuple(int(s) for s in raw["head_sizes"]))


def head_sizes(config: EngramConfig) -> list[tuple[int, ...]]:
    """Per layer (in config order), the head sizes in (order, head) order.

    One increasing stream of primes per vocab size: every prime a stream has passed is
    taken, so the next untaken prime it yields is the smallest untaken one >= that vocab
    size, and no head searches again past what earlier heads took (the work grows with
    the primes covered, not with heads x primes)."""
    blocks = PrimeBlocks()
    taken: set[int] = set()
    streams: dict[int, Iterator[int]] = {}
    layers = []
    for _layer in config.layer_ids:
        sizes = []
        for order_index in range(config.max_ngram - 1):
            vocab = config.vocab_sizes[order_index]
            stream = streams.setdefault(vocab, blocks.primes_from(vocab))
            for _head in range(config.n_heads):
                size = next(p for p in stream if p not in taken)
                taken.add(size)
                sizes.append(size)
        layers.append(tuple(sizes))
    return layers


def build_layout(config: EngramConfig) -> list[LayerLayout]:
    """The layers' geometry; refuses a config whose row counts disagree with its heads."""
    layouts = []
    for layer, stated, sizes in zip(config.layer_ids, config.num_embeddings, head_sizes(config)):
        layout = LayerLayout(layer=layer, head_dim=config.head_dim, head_sizes=sizes)
        if layout.rows != stated:
            raise LayoutError(f"{config.source}: layer {layer}: engram_num_embeddings is {stated} but its "
                              f"{len(sizes)} heads sum to {layout.rows} rows")
        layouts.append(layout)
    return layouts
