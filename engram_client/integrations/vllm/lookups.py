"""vLLM's Engram lookups on engramd's host path: ``Engram._start_prefetch`` and ``ParallelEngramEmbedding.lookup``.

vLLM 0.33.0 (cpu_offload) launches its Triton UVA kernel on the layers' shared prefetch stream
from ``_start_prefetch``, records ``_prefetch_done`` there, and ``_ready_rows`` has the current
stream wait on that event.  The replacement keeps that contract and only changes who reads the
rows: on the same prefetch stream it asks engramd for this rank's columns of the ids (a host
node gathers them from the mapped table, the copy engine moves them, a small kernel dequantizes
in HBM; no SM waits on PCIe), copies them into vLLM's persistent ``staged_rows`` slice (graph
replays need that address), zeroes vLLM's padding heads, and records the same event.  The
prefetch stream joins engramd's lookup with ``wait()``, so every stream forked here is joined
before ``_ready_rows``: one CUDA graph capture can hold the whole lookup.  So under vLLM's FULL
graphs (where its ``eager_break_during_capture`` calls through) the graph holds engramd's host
path and nothing breaks; under breakable PIECEWISE graphs ``_start_prefetch`` and
``_finish_prefetch`` stay eager breaks, as in vLLM, because the lookup spans graph segments.

The ids are vLLM's hash ids, rows of the whole layer; a rank passes its own heads' columns.
An id outside them (vLLM's hash never makes one) zeroes its row and raises IdsOutOfRangeError
at the next lookup of that layer, where vLLM's kernel would have returned zeros silently.
"""
from __future__ import annotations

import torch

from engram_client import IntegrationError

from .served_layer import ServedLayer
from .storage import EngramdStorage


def served_of(embedding) -> ServedLayer:
    storage = getattr(embedding, "_shared_memory", None)
    if not isinstance(storage, EngramdStorage):
        raise IntegrationError("this ParallelEngramEmbedding was built without engramd's storage (before the plugin "
                               "patched vLLM?), and the plugin never looks rows up in a table of vLLM's own")
    return storage.served


def _own_columns(served: ServedLayer, ids: torch.Tensor) -> torch.Tensor:
    return ids[:, served.head_start:served.head_start + served.local_heads]


def _fill(out: torch.Tensor, rows: torch.Tensor, local_heads: int) -> None:
    out[:, :local_heads].copy_(rows)
    if out.shape[1] > local_heads:
        out[:, local_heads:].zero_()  # vLLM's padding heads: zeros, as its kernel writes them


def lookup(self, indices: torch.Tensor, out: torch.Tensor, background: bool = False) -> None:
    """``ParallelEngramEmbedding.lookup``: rows into ``out`` [tokens, part_n_hash_cols, dim], ordered
    on the current stream (vLLM calls it inline where it has no prefetch stream).  ``background``
    limited vLLM's grid; engramd's host path holds no SMs, so it changes nothing here."""
    served = served_of(self)
    if out.dtype != served.table.out_dtype:
        raise IntegrationError(f"layer {served.layer}: vLLM asked for {out.dtype} rows (the packed FP8 staging of "
                               f"its DP-sharded tables); engramd serves DP-shared tables as {served.table.out_dtype}")
    if indices.shape[0]:
        _fill(out, served.table.lookup(_own_columns(served, indices)), served.local_heads)


def start_prefetch(self, hash_ids: torch.Tensor, rows: torch.Tensor) -> None:
    """``Engram._start_prefetch``: the lookup on vLLM's prefetch stream, ``_prefetch_done`` recorded
    after it (patches.py wraps it in vLLM's eager_break_during_capture, as vLLM's own is)."""
    served = served_of(self.embed_tokens)
    stream = self._prefetch_stream
    stream.wait_stream(torch.cuda.current_stream())
    hash_ids.record_stream(stream)  # its columns are copied on the prefetch stream
    with torch.cuda.stream(stream):
        if hash_ids.shape[0]:
            _fill(rows, served.table.prefetch(_own_columns(served, hash_ids)).wait(), served.local_heads)
    self._prefetch_done.record(stream)
