"""The UVA path through the HBM row cache: classify, read only the misses over PCIe, serve.

    ids ──> classify ──> marks: a row id (miss), SKIP_ID (hit), OUTSIDE_ID ──> fetch (this kernel) ──┐
              │  slotmap                                                      packed rows over PCIe  │
              v                                                                                      v
    out <── serve, insert, move (the cache's kernels): hits from the cache, misses from staging <── HBM staging

The cache's kernels are the host path's (lookup/cache/kernels.py); only the fetch differs: where the
host gather copies a miss's packed row into pinned staging and the copy engine moves it, this
kernel reads it through the table's UVA view straight into device staging.  So both paths keep
the cache's rules (one call at a time on the prefetch stream, its sequence number on the device,
the disarm word) and give the same bits: serve dequantizes with the UVA kernel's row fetch.

Every step has a size known before it runs (the call's ids), so nothing waits on the host.  The
fetch's grid is capped like the lookup kernel's (``max_programs``): it reads PCIe beside the
model.  Misses are fetched as they come, without the lookup kernel's dedup: the rows a call
repeats most are the ones the cache holds.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...core.errors import EngramError
from ..cache.row_cache import OUTSIDE_ID, SKIP_ID
from ..config import LookupConfig
from .lookup_kernel import _check, _grid

_SKIP: tl.constexpr = tl.constexpr(SKIP_ID)
_OUTSIDE: tl.constexpr = tl.constexpr(OUTSIDE_ID)


@triton.jit
def _fetch_misses_kernel(table_ptr, marks_ptr, staging_ptr, bad_ptr, n, row_lo, ROW_BYTES: tl.constexpr,
                         HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr):
    """Staging row r: the packed row marks[r] (a row id) as the table holds it, zeros for OUTSIDE_ID
    (counted in bad_ptr), untouched for SKIP_ID.  Values and scales are copied as two power-of-two
    spans: HEAD_DIM bytes, then HEAD_DIM / 32."""
    cols = tl.arange(0, HEAD_DIM)
    scale_cols = tl.arange(0, HEAD_DIM // 32)
    bad = 0
    for block in range(tl.program_id(0), tl.cdiv(n, BLOCK_R), tl.num_programs(0)):
        r = block * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)  # int64: r * ROW_BYTES can pass 2^31
        in_call = r < n
        mark = tl.load(marks_ptr + r, mask=in_call, other=_SKIP)
        fetch = in_call & (mark >= 0)
        outside = in_call & (mark == _OUTSIDE)
        write = (fetch | outside)[:, None]
        base = tl.where(fetch, mark - row_lo, 0) * ROW_BYTES
        values = tl.load(table_ptr + base[:, None] + cols[None, :], mask=fetch[:, None], other=0)
        scales = tl.load(table_ptr + base[:, None] + HEAD_DIM + scale_cols[None, :], mask=fetch[:, None], other=0)
        dest = r * ROW_BYTES
        tl.store(staging_ptr + dest[:, None] + cols[None, :], values, mask=write)
        tl.store(staging_ptr + dest[:, None] + HEAD_DIM + scale_cols[None, :], scales, mask=write)
        bad += tl.sum(outside.to(tl.int32), axis=0)
    if bad > 0:
        tl.atomic_add(bad_ptr, bad)


def launch_cached_lookup(table: torch.Tensor, ids: torch.Tensor, out: torch.Tensor, bad_count: torch.Tensor,
                         row_lo: int, row_hi: int, head_dim: int, row_bytes: int, config: LookupConfig, cache,
                         kernels, stream) -> None:
    """Enqueue a lookup through ``cache`` (an HbmRowCache for rows [row_lo, row_hi), ``kernels`` its
    CacheKernels) on the current stream, which is ``stream`` (the prefetch stream; None on the CPU, in
    Triton's interpreter).  The launcher's checks are the lookup kernel's."""
    _check(table, ids, out, bad_count, row_lo, row_hi, head_dim, row_bytes)
    n = ids.numel()
    if n == 0:
        return
    cache.check_call(n)
    if out.dtype is not kernels.out_dtype:
        raise EngramError(f"the cache's kernels serve {kernels.out_dtype} rows, the output is {out.dtype}")
    # The call's buffers come from the current (prefetch) stream: freed after this call, their memory
    # serves a later call on that stream only after this one's kernels (the allocator is stream-ordered).
    slotmap = torch.empty(n, dtype=torch.int32, device=ids.device)
    marks = torch.empty(n, dtype=torch.int64, device=ids.device)
    staging = torch.empty(n * row_bytes, dtype=torch.uint8, device=ids.device)
    raw = stream.cuda_stream if stream is not None else 0
    with cache.enqueue_lock:
        kernels.classify(ids, n, row_lo, row_hi, slotmap, marks, stream, raw)
        _fetch_misses_kernel[_grid(n, config.block_rows, config.max_programs)](
            table, marks, staging, bad_count, n, row_lo, ROW_BYTES=row_bytes, HEAD_DIM=head_dim,
            BLOCK_R=config.block_rows, num_warps=config.num_warps)
        kernels.serve(staging, out, n, slotmap, marks, stream, raw)
