"""The GPU lookup: gather packed rows through UVA and dequantize them, in Triton.

Each program takes blocks of BLOCK_R ids, striding over the call so that the grid
can be capped (``max_programs``): lookups run beside the model's kernels, and a
grid of thousands of PCIe-latency-bound programs crowds them out.  An id outside [row_lo, row_hi) is never used as
an address: its row is masked to zero and counted in ``bad_count``, which the
caller turns into an error.  The arithmetic mirrors engram_client.lookup.dequant exactly
(fp8 -> fp32, times a power of two built from the scale's bits, one rounding), so
GPU and CPU give identical bits.

The launcher checks everything the kernel assumes before it launches.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...core.errors import EngramError
from ...core.layout import QUANT_BLOCK, packed_row_bytes
from ..config import LookupConfig
from ..row_fetch import OUT_DTYPES, fetch_rows

DEFAULT_CONFIG = LookupConfig()

ID_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _lookup_kernel(table_ptr, ids_ptr, perm_ptr, out_ptr, bad_ptr, armed_ptr, n_ids, row_lo, row_hi,
                   ROW_BYTES: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
                   OUT_DTYPE: tl.constexpr, SORTED: tl.constexpr, ARMED: tl.constexpr):
    """Direct: the row of ids[r] goes to out[r].  SORTED: ids_ptr holds the ids sorted and
    perm_ptr where each came from; each distinct id is fetched once, in address order, and
    written where its first occurrence goes (_copy_duplicates_kernel fills in the repeats).
    ARMED (a launch captured in a CUDA graph): the word at armed_ptr is read first, and where it is
    0 (the rows were released: graph_words.py) nothing is read, every row comes back zero and
    nothing is counted bad.

    Each program walks blocks pid, pid + programs, ...: a bounded grid leaves SMs to the model."""
    cols = tl.arange(0, HEAD_DIM)
    bad = 0
    live = True
    if ARMED:
        live = tl.load(armed_ptr, volatile=True) != 0
    for block in range(tl.program_id(0), tl.cdiv(n_ids, BLOCK_R), tl.num_programs(0)):
        r = block * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)  # int64: r * HEAD_DIM can pass 2^31
        in_call = r < n_ids
        ids = tl.load(ids_ptr + r, mask=in_call, other=0).to(tl.int64)
        in_range = (ids >= row_lo) & (ids < row_hi)
        valid = in_call & in_range & live
        bad += tl.sum((in_call & ~in_range & live).to(tl.int32), axis=0)
        if SORTED:
            prev = tl.load(ids_ptr + r - 1, mask=in_call & (r > 0), other=0).to(tl.int64)
            write = in_call & ((r == 0) | (ids != prev))
            dest = tl.load(perm_ptr + r, mask=in_call, other=0).to(tl.int64)
        else:
            write = in_call
            dest = r
        out = fetch_rows(table_ptr, ids - row_lo, write & valid, ROW_BYTES, HEAD_DIM).to(OUT_DTYPE)
        tl.store(out_ptr + dest[:, None] * HEAD_DIM + cols[None, :], out, mask=write[:, None])
    if bad > 0:
        tl.atomic_add(bad_ptr, bad)


@triton.jit
def _copy_duplicates_kernel(sorted_ptr, perm_ptr, run_start_ptr, out_ptr, n_ids,
                            HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr):
    """Every repeated id copies its row, in GPU memory, from where its first occurrence went."""
    cols = tl.arange(0, HEAD_DIM)
    for block in range(tl.program_id(0), tl.cdiv(n_ids, BLOCK_R), tl.num_programs(0)):
        r = block * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)  # int64: r * HEAD_DIM can pass 2^31
        in_call = r < n_ids
        ids = tl.load(sorted_ptr + r, mask=in_call, other=0)
        prev = tl.load(sorted_ptr + r - 1, mask=in_call & (r > 0), other=0)
        dup = in_call & (r > 0) & (ids == prev)
        start = tl.load(run_start_ptr + r, mask=dup, other=0)
        src = tl.load(perm_ptr + start, mask=dup, other=0).to(tl.int64)
        dest = tl.load(perm_ptr + r, mask=dup, other=0).to(tl.int64)
        v = tl.load(out_ptr + src[:, None] * HEAD_DIM + cols[None, :], mask=dup[:, None], other=0)
        tl.store(out_ptr + dest[:, None] * HEAD_DIM + cols[None, :], v, mask=dup[:, None])


def _grid(n: int, block_rows: int, max_programs: int | None) -> tuple[int]:
    blocks = triton.cdiv(n, block_rows)
    return (blocks if not max_programs else max(1, min(blocks, max_programs)),)


def launch_lookup_dedup(table: torch.Tensor, ids: torch.Tensor, out: torch.Tensor, bad_count: torch.Tensor,
                        row_lo: int, row_hi: int, head_dim: int, row_bytes: int,
                        config: LookupConfig = DEFAULT_CONFIG) -> None:
    """Like launch_lookup, but each distinct id crosses PCIe once, in address order.

    Sort, then fetch first occurrences, then copy repeats within HBM: every step has a size
    known in advance, so nothing waits on the host (torch.unique would: its output size is
    data-dependent)."""
    _check(table, ids, out, bad_count, row_lo, row_hi, head_dim, row_bytes)
    n = ids.numel()
    if n == 0:
        return
    block_rows, num_warps = config.block_rows, config.num_warps
    sorted_ids, perm = torch.sort(ids)
    positions = torch.arange(n, device=ids.device)
    is_first = torch.ones(n, dtype=torch.bool, device=ids.device)
    is_first[1:] = sorted_ids[1:] != sorted_ids[:-1]
    run_start = torch.cummax(positions * is_first, 0).values
    grid = _grid(n, block_rows, config.max_programs)
    _lookup_kernel[grid](table, sorted_ids, perm, out, bad_count, None, n, row_lo, row_hi,
                         ROW_BYTES=row_bytes, HEAD_DIM=head_dim, BLOCK_R=block_rows, OUT_DTYPE=OUT_DTYPES[out.dtype],
                         SORTED=True, ARMED=False, num_warps=num_warps)
    _copy_duplicates_kernel[grid](sorted_ids, perm, run_start, out, n, HEAD_DIM=head_dim, BLOCK_R=block_rows,
                                  num_warps=num_warps)


def _check(table, ids, out, bad_count, row_lo, row_hi, head_dim, row_bytes) -> None:
    device = table.device
    if device.type != "cuda":
        raise EngramError(f"lookup kernel needs a CUDA table view, got {device}")
    for name, tensor in (("ids", ids), ("out", out), ("bad_count", bad_count)):
        if tensor.device != device:
            raise EngramError(f"{name} is on {tensor.device}, the table view is on {device}")
        if not tensor.is_contiguous():
            raise EngramError(f"{name} must be contiguous")
    if table.dtype != torch.uint8 or table.dim() != 1:
        raise EngramError("table view must be a 1-D uint8 tensor")
    if table.numel() < (row_hi - row_lo) * row_bytes:
        raise EngramError(f"table view of {table.numel()} bytes is shorter than rows [{row_lo}, {row_hi})")
    if ids.dtype not in ID_DTYPES:
        raise EngramError(f"ids must be int32 or int64, got {ids.dtype}")
    if out.dtype not in OUT_DTYPES:
        raise EngramError(f"out dtype must be bfloat16 or float32, got {out.dtype}")
    if out.shape != (ids.numel(), head_dim):
        raise EngramError(f"out has shape {tuple(out.shape)}, expected ({ids.numel()}, {head_dim})")
    if bad_count.dtype != torch.int32 or bad_count.numel() != 1:
        raise EngramError("bad_count must be one int32")
    if head_dim % QUANT_BLOCK or head_dim & (head_dim - 1):
        raise EngramError(f"head_dim {head_dim} must be a power of two and a multiple of 32 for this kernel")
    if row_bytes != packed_row_bytes(head_dim):
        raise EngramError(f"row_bytes {row_bytes} does not match head_dim {head_dim} packed with its scales")


def launch_lookup(table: torch.Tensor, ids: torch.Tensor, out: torch.Tensor, bad_count: torch.Tensor,
                  row_lo: int, row_hi: int, head_dim: int, row_bytes: int,
                  config: LookupConfig = DEFAULT_CONFIG, armed: torch.Tensor | None = None) -> None:
    """Enqueue the lookup on the current stream.  ``table`` views rows [row_lo, row_hi); the grid,
    block and warps come from ``config``; ``armed`` (one int32 on the device, for a launch captured
    in a CUDA graph): read at every run, 0 means the rows are gone (the kernel's docstring)."""
    _check(table, ids, out, bad_count, row_lo, row_hi, head_dim, row_bytes)
    if armed is not None and (armed.device != table.device or armed.dtype != torch.int32 or armed.numel() != 1):
        raise EngramError(f"armed must be one int32 on {table.device}, got {armed.numel()} {armed.dtype} on {armed.device}")
    n = ids.numel()
    if n == 0:
        return
    block_rows, num_warps = config.block_rows, config.num_warps
    grid = _grid(n, block_rows, config.max_programs)
    _lookup_kernel[grid](table, ids, None, out, bad_count, armed, n, row_lo, row_hi, ROW_BYTES=row_bytes,
                         HEAD_DIM=head_dim, BLOCK_R=block_rows, OUT_DTYPE=OUT_DTYPES[out.dtype],
                         SORTED=False, ARMED=armed is not None, num_warps=num_warps)
