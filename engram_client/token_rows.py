"""Tokens in, rows out: the client's hasher for a mapped table, and prefetching by token.

    handles = client.prefetch_tokens(token_ids, seq_starts=[0, 512])
    embeddings = {layer: handle.wait() for layer, handle in handles.items()}
    # each: [tokens, heads, head_dim]

The hasher is built once per mapped generation from the table's hashing section, so
it always matches the rows it indexes; where the table has none, the client gets an
UnavailableHasher that says why.  Prefetching hashes on the device of the token ids
and hands each layer's row ids (a strided column of the hash's output) to that layer's
table, whose lookup config picks the path: ids on the host are range-checked there, ids
on the GPU by the lookup itself (host gather or UVA kernel), which zeroes their rows and
reports them without a host sync (out_of_range.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .core.errors import EngramError
from .core.table_file import read_header
from .hashing.hasher import NgramHasher, UnavailableHasher

if TYPE_CHECKING:
    from .attach.mapped_generation import MappedGeneration
    from .lookup.prefetch import PrefetchHandle


def hasher_for(mapped: "MappedGeneration") -> NgramHasher | UnavailableHasher:
    """The hasher for a mapped generation (its token map copied out of the mapping)."""
    header, _ = read_header(mapped.path)
    section = header.hashing
    if section is None:
        source = "the embedded demo" if header.checkpoint == "<demo>" else header.checkpoint
        return UnavailableHasher(f"the table {mapped.path} (from {source}) has no token map: its checkpoint has no "
                                 "tokenizer.json or its config no engram_pad_token_id; look rows up by id instead")
    if mapped.mapping is None:
        return UnavailableHasher("the client is closed")
    raw = mapped.mapping.tensor(section.map_offset, section.map_bytes).numpy()
    token_map = section.read_map(raw, mapped.path)
    return NgramHasher(section, token_map, [entry.layout for entry in header.layers])


def prefetch_tokens(hasher, tables: dict, token_ids: torch.Tensor, seq_starts=None,
                    history: torch.Tensor | None = None) -> dict[int, "PrefetchHandle"]:
    """Hash once, then start every layer's lookup; returns {layer: handle}, outputs [tokens, heads, head_dim]."""
    if not tables:
        raise EngramError("no tables to prefetch from: the client is closed")
    rows = hasher.row_ids(token_ids, seq_starts, history)
    return {layer: tables[layer].prefetch(rows[:, index]) for index, layer in enumerate(hasher.layers)}
