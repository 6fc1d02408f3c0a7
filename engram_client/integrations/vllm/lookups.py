"""vLLM's Engram lookups on engramd's host path: ``Engram._start_prefetch`` and ``ParallelEngramEmbedding.lookup``.

vLLM 0.33.0 and 0.34.0 (cpu_offload) launch their Triton UVA kernel on the layers' shared
prefetch stream from ``_start_prefetch`` (0.34.0 inline instead above a GPU's token
threshold), record ``_prefetch_done`` there, and ``_ready_rows`` has the current
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
vLLM's specialized decode (``EngramPrefetch``) starts each layer's WKV on a side stream once
``_prefetch_done`` is reached, reading ``staged_rows``: recorded after the rows are there, the
event hands it engramd's rows, so that path keeps working.

The ids are vLLM's hash ids, rows of the whole layer; a rank passes its own heads' columns.
vLLM's ``DEAD_ID`` (-1) means "no row": vLLM 0.34's profile and DP dummy runs look up nothing
else (``NgramHashState.dummy_hashes``), and a DP rank with no requests does one every step
while its peers serve.  Those ids get zero rows, as vLLM's kernel gives them, without a host
synchronization and inside a captured graph alike: on the ids' device they are moved to the
rank's first row before the lookup, and their rows zeroed after it.  Any other id outside the
rank's rows (vLLM's hash never makes one) zeroes its row and raises IdsOutOfRangeError at the
next lookup of that layer, where vLLM's kernel would have returned zeros silently.
"""
from __future__ import annotations

import torch

from engram_client import IntegrationError
from engram_client.integrations.rank.served_layer import ServedLayer

from .fences import DEAD_ID
from .storage import EngramdStorage


def served_of(embedding) -> ServedLayer:
    storage = getattr(embedding, "_shared_memory", None)
    if not isinstance(storage, EngramdStorage):
        raise IntegrationError("this ParallelEngramEmbedding was built without engramd's storage (before the plugin "
                               "patched vLLM?), and the plugin never looks rows up in a table of vLLM's own")
    return storage.served


def _own_columns(served: ServedLayer, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rank's columns of ``ids``, DEAD ids moved to its first row (read, then zeroed by ``_fill``),
    and where the DEAD ids were; all on the ids' device, on the current stream."""
    own = ids[:, served.head_start:served.head_start + served.local_heads]
    dead = own == DEAD_ID
    return torch.where(dead, served.table.row_range[0], own), dead


def _fill(out: torch.Tensor, rows: torch.Tensor, dead: torch.Tensor, local_heads: int) -> None:
    own = out[:, :local_heads]
    own.copy_(rows)
    own.masked_fill_(dead.unsqueeze(-1), 0)  # DEAD ids: zero rows, as vLLM's kernel gives them
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
        ids, dead = _own_columns(served, indices)
        _fill(out, served.table.lookup(ids), dead, served.local_heads)


def start_prefetch(self, hash_ids: torch.Tensor, rows: torch.Tensor) -> None:
    """``Engram._start_prefetch``: the lookup on vLLM's prefetch stream, ``_prefetch_done`` recorded
    after it (patches.py wraps it in vLLM's eager_break_during_capture, as vLLM's own is)."""
    served = served_of(self.embed_tokens)
    stream = self._prefetch_stream
    stream.wait_stream(torch.cuda.current_stream())
    hash_ids.record_stream(stream)  # its columns are copied on the prefetch stream
    with torch.cuda.stream(stream):
        if hash_ids.shape[0]:
            ids, dead = _own_columns(served, hash_ids)
            _fill(rows, served.table.prefetch(ids).wait(), dead, served.local_heads)
    self._prefetch_done.record(stream)
