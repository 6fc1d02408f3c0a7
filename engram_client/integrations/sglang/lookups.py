"""SGLang's Engram lookups on engramd's host path: ``EngramEmbedding._owned_rows``.

SGLang 0.5.23 has no Engram prefetch stream: ``Engram.forward`` looks its rows up inline, on
the current stream, and every path of ``EngramEmbedding.forward`` that can serve a per-rank
table (plain, DP-gathered ids, prefill CP) ends in ``_owned_rows(indices)``: the rows of
``indices`` this rank holds, zeros for the rest, which SGLang's TP all-reduce (or
reduce-scatter) then sums into every row.  The replacement keeps that contract with engramd's
rows: this rank's hash columns go through ``table.lookup`` (a host node gathers them from
the mapped table, the copy engine moves them, a small kernel dequantizes; engramd's side
streams join the current one before it returns, so one CUDA graph capture holds the whole
lookup, and nothing here synchronizes with the host), the other columns are zeros.

Ids that are not the hash of their column, as SGLang's own gather treats them:

- any id outside this rank's rows in its own columns: not read, zero (SGLang's kernel masks
  it the same way), so engramd never sees an id outside the registered range;
- id 0, which SGLang writes for padding (idle DP batches, prefill CP pad rows, the DP gather's
  slack): row 0 wherever it appears, from the rank that holds row 0, as SGLang's all-reduce
  gives it.  Any other id in another rank's columns (SGLang's hash never writes one) is zero.
"""
from __future__ import annotations

import torch


def owned_rows(self, indices: torch.Tensor) -> torch.Tensor:
    """Replaces ``EngramEmbedding._owned_rows``: bf16 [*indices.shape, dim]."""
    served = self.engramd
    table, first, count = served.table, served.head_start, served.local_heads
    lo, hi = table.row_range
    out = self.new_rows(indices)
    ids = indices[..., first:first + count]
    inside = (ids >= lo) & (ids < hi)
    flat = torch.where(inside, ids, lo).reshape(-1).to(torch.int64)
    holds_pad = lo == 0
    if holds_pad:
        flat = torch.cat([flat, self.engramd_pad_id])  # row 0, for pad ids in other ranks' columns
    rows = table.lookup(flat)
    own = rows[:ids.numel()].view(*ids.shape, self.dim).masked_fill(~inside.unsqueeze(-1), 0)
    if holds_pad:
        out.copy_(torch.where((indices == 0).unsqueeze(-1), rows[-1], 0).to(out.dtype))
    else:
        out.zero_()
    out[..., first:first + count, :] = own
    return out
