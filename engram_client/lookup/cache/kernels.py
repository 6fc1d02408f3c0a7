"""The HBM row cache's kernels, in Triton, on the prefetch stream of whichever path serves the call.

``classify`` runs before the misses are fetched (the host gather, or uva/cached_lookup.py): for
every id it looks in the fixed part (sorted keys, a binary search) and the recency part (a
set-associative table: the id's set, WAYS keys), and writes

  slotmap[i]  >= 0: row slotmap[i] of the fixed part;  <= -2: slot -2 - slotmap[i] of the recency
              part;  -1: a miss, read from staging row i
  gather[i]   the id to fetch, or SKIP_ID (-1) for a hit, which the fetch neither reads nor
              counts (ids out of range become OUTSIDE_ID, -2: the fetch zeroes and counts them)

It stamps each recency way it hits with the call's sequence number and, per set, keeps the
largest claim of the call's misses there (atomic max of seq << POSITION_BITS | i + 1).

``serve()`` runs after the staged rows reached HBM and enqueues three kernels: serve (out[i] is
the dequantized row from wherever slotmap says), insert (each miss that won its set's claim takes
the way of its set least recently stamped and not stamped by this call, and the call's number is
committed) and move (the miss's row, packed bytes from device staging, into that way).  So no row
of the recency part is written while this call reads it (the ways it hits carry its stamp) and no
two misses write one way (one winner per set); calls are ordered by the prefetch stream, and a graph
replay is a call like any other.  The call's sequence number lives on the device (``control``):
classify reads control[0] + 1 and every program writes it to control[1]; insert reads control[1],
and its program 0 commits it to control[0].  control[2] == 0 disarms the cache (the client closed
or moved to another generation): every id is a miss and nothing of the cache is read or written.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..compiled_launch import CompiledLaunch
from ..row_fetch import OUT_DTYPES, fetch_rows
from .row_cache import POSITION_BITS, WAYS, on_device

CLASSIFY_BLOCK = 256
SERVE_BLOCK = 16
INSERT_BLOCK = 128
MOVE_BLOCK = 1024
_MIX: tl.constexpr = tl.constexpr(0x5851F42D4C957F2D)  # an odd 63-bit multiplier: sets from row ids


@triton.jit
def _set_of(ids, n_sets):
    h = ids * _MIX
    h = h ^ (h >> 29)
    return h & (n_sets - 1)


@triton.jit
def _classify_kernel(ids_ptr, n, row_lo, row_hi, fixed_keys_ptr, n_fixed, search_steps, rec_keys_ptr,
                     rec_stamps_ptr, claims_ptr, n_sets, control_ptr, slotmap_ptr, gather_ptr,
                     BLOCK: tl.constexpr, WAYS_: tl.constexpr, POS_BITS: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    in_call = offs < n
    ids = tl.load(ids_ptr + offs, mask=in_call, other=0).to(tl.int64)
    armed = tl.load(control_ptr + 2) != 0
    seq = tl.load(control_ptr) + 1
    in_range = in_call & (ids >= row_lo) & (ids < row_hi)
    look = in_range & armed
    # Fixed part: the first key >= id, in sorted keys.
    lo = tl.zeros([BLOCK], dtype=tl.int64)
    hi = tl.zeros([BLOCK], dtype=tl.int64) + n_fixed
    for _ in range(search_steps):
        active = look & (lo < hi)
        mid = (lo + hi) // 2
        key = tl.load(fixed_keys_ptr + mid, mask=active, other=0)
        right = active & (key < ids)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(active & ~right, mid, hi)
    found = tl.load(fixed_keys_ptr + lo, mask=look & (lo < n_fixed), other=-1)
    fixed_hit = look & (lo < n_fixed) & (found == ids)
    # Recency part: the id's set, WAYS ways.
    s = _set_of(ids, n_sets)
    probe = look & ~fixed_hit
    way_slot = tl.zeros([BLOCK], dtype=tl.int64) - 1
    for w in tl.static_range(WAYS_):
        key = tl.load(rec_keys_ptr + s * WAYS_ + w, mask=probe, other=-1)
        way_slot = tl.where(probe & (key == ids) & (way_slot < 0), s * WAYS_ + w, way_slot)
    rec_hit = way_slot >= 0
    tl.store(rec_stamps_ptr + way_slot, seq + tl.zeros([BLOCK], dtype=tl.int64), mask=rec_hit)
    miss = in_call & ~fixed_hit & ~rec_hit
    tl.atomic_max(claims_ptr + s, (seq << POS_BITS) | (offs + 1), mask=miss & look)
    slot = tl.where(fixed_hit, lo, tl.where(rec_hit, -2 - way_slot, -1))
    tl.store(slotmap_ptr + offs, slot.to(tl.int32), mask=in_call)
    tl.store(gather_ptr + offs, tl.where(miss, tl.where(in_range, ids, -2), -1), mask=in_call)
    tl.store(control_ptr + 1, seq)


@triton.jit
def _serve_kernel(staging_ptr, out_ptr, n, slotmap_ptr, fixed_rows_ptr, rec_rows_ptr, control_ptr,
                  ROW_BYTES: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr, OUT_DTYPE: tl.constexpr):
    armed = tl.load(control_ptr + 2) != 0
    cols = tl.arange(0, HEAD_DIM)
    for block in range(tl.program_id(0), tl.cdiv(n, BLOCK_R), tl.num_programs(0)):
        # block * BLOCK_R < 2^26 (MAX_CALL_IDS) in int32; r is int64 (r * HEAD_DIM can pass 2^31).  No
        # .to() on block: Triton's interpreter runs this loop over Python ints.
        r = block * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
        in_call = r < n
        where = tl.load(slotmap_ptr + r, mask=in_call, other=-1).to(tl.int64)
        from_fixed = in_call & armed & (where >= 0)
        from_recent = in_call & armed & (where <= -2)
        staged = in_call & ~from_fixed & ~from_recent
        values = fetch_rows(staging_ptr, r, staged, ROW_BYTES, HEAD_DIM)
        values = tl.where(from_fixed[:, None], fetch_rows(fixed_rows_ptr, where, from_fixed, ROW_BYTES, HEAD_DIM),
                          values)
        values = tl.where(from_recent[:, None],
                          fetch_rows(rec_rows_ptr, -2 - where, from_recent, ROW_BYTES, HEAD_DIM), values)
        tl.store(out_ptr + r[:, None] * HEAD_DIM + cols[None, :], values.to(OUT_DTYPE), mask=in_call[:, None])


@triton.jit
def _insert_kernel(n, gather_ptr, slotmap_ptr, rec_keys_ptr, rec_stamps_ptr, claims_ptr, n_sets, control_ptr,
                   BLOCK_R: tl.constexpr, WAYS_: tl.constexpr, POS_BITS: tl.constexpr):
    """A miss that won its set's claim takes the way least recently used by earlier calls (after
    serve: every read of the recency part by this call is done).  Its key and stamp are written
    here, and gather[r] becomes the way (or -1) for _move_rows_kernel: the gather has read its
    copy of the ids by now (stream order), and the next call's classify rewrites them."""
    seq = tl.load(control_ptr + 1)
    armed = tl.load(control_ptr + 2) != 0
    never = (1 << 62)
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    in_call = r < n
    miss = tl.load(slotmap_ptr + r, mask=in_call, other=0) == -1
    ids = tl.load(gather_ptr + r, mask=in_call & miss & armed, other=-1)
    wants = in_call & miss & armed & (ids >= 0)
    s = _set_of(ids, n_sets)
    won = wants & (tl.load(claims_ptr + s, mask=wants, other=0) == ((seq << POS_BITS) | (r + 1)))
    best = tl.zeros([BLOCK_R], dtype=tl.int64) + never
    best_way = tl.zeros([BLOCK_R], dtype=tl.int64)
    for w in tl.static_range(WAYS_):
        stamp = tl.load(rec_stamps_ptr + s * WAYS_ + w, mask=won, other=never)
        stamp = tl.where(stamp == seq, never, stamp)  # a way this call hit keeps its row
        better = stamp < best
        best = tl.where(better, stamp, best)
        best_way = tl.where(better, w, best_way)
    put = won & (best < never)
    slot = s * WAYS_ + best_way
    tl.store(rec_keys_ptr + slot, ids, mask=put)
    tl.store(rec_stamps_ptr + slot, seq + tl.zeros([BLOCK_R], dtype=tl.int64), mask=put)
    tl.store(gather_ptr + r, tl.where(put, slot, -1), mask=in_call)
    if tl.program_id(0) == 0:
        tl.store(control_ptr, seq)  # the call's number, committed: every program read it from control[1]


@triton.jit
def _move_rows_kernel(staging_ptr, n, dest_ptr, rec_rows_ptr, ROW_BYTES: tl.constexpr, BLOCK: tl.constexpr):
    """Staged row r to recency way dest[r] where dest[r] >= 0, byte by byte, element-wise.  (The same
    move as a 2-D block of rows scattered to their ways lost some of its writes with Triton 3.6 on
    the H200 machine: keys landed, rows stayed zero.  Element-wise, every row arrived.)"""
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    r = e // ROW_BYTES
    byte = e % ROW_BYTES
    in_call = r < n
    dest = tl.load(dest_ptr + r, mask=in_call, other=-1)
    move = in_call & (dest >= 0)
    value = tl.load(staging_ptr + r * ROW_BYTES + byte, mask=move, other=0)
    tl.store(rec_rows_ptr + dest * ROW_BYTES + byte, value, mask=move)


def search_steps(n_fixed: int) -> int:
    """Halvings of a binary search over ``n_fixed`` keys."""
    return max(0, n_fixed).bit_length()


SAMPLE_IDS = 413  # the ids of the calls the kernels are compiled for: not 1, not a multiple of 16 (compiled_launch.py)


class JitLaunch:
    """CompiledLaunch's interface where there is no compiled runner to prove: tensors on the CPU,
    in Triton's interpreter (TRITON_INTERPRET=1).  Every call is the JIT's launch."""

    fast = False

    def __init__(self, kernel, sample: tuple, constants: dict, device: torch.device):
        self.kernel, self.constants = kernel, constants

    def __call__(self, grid: int, stream, raw_stream: int, *args) -> None:
        self.kernel[(grid,)](*args, **self.constants)


class CacheKernels:
    """The cache's kernels compiled for one cache and output dtype (compiled_launch.py): built when
    a path takes the cache (attach, refresh, a UVA path's first cached call), never under a capture."""

    def __init__(self, cache, out_dtype, device):
        n, rows = SAMPLE_IDS, cache.row_bytes
        launcher = CompiledLaunch if device.type == "cuda" else JitLaunch
        with on_device(device):
            ids = {dtype: torch.zeros(n, dtype=dtype, device=device) for dtype in (torch.int32, torch.int64)}
            slotmap = torch.zeros(n, dtype=torch.int32, device=device)
            gather = torch.zeros(n, dtype=torch.int64, device=device)
            staging = torch.zeros(n * rows, dtype=torch.uint8, device=device)
            out = torch.zeros((n, cache.head_dim), dtype=out_dtype, device=device)
        self.cache, self.out_dtype = cache, out_dtype
        self._search = search_steps(cache.fixed_count)
        self._classify = {dtype: launcher(_classify_kernel, self._classify_args(sample, n, cache.row_lo,
                                                                                      cache.row_hi, slotmap, gather),
                                                dict(BLOCK=CLASSIFY_BLOCK, WAYS_=WAYS, POS_BITS=POSITION_BITS), device)
                          for dtype, sample in ids.items()}
        self._serve = launcher(_serve_kernel, (staging, out, n, slotmap, cache.fixed_rows, cache.recent_rows,
                                                     cache.control),
                                     dict(ROW_BYTES=rows, HEAD_DIM=cache.head_dim, BLOCK_R=SERVE_BLOCK,
                                          OUT_DTYPE=OUT_DTYPES[out_dtype]), device)
        self._insert = launcher(_insert_kernel, (n, gather, slotmap, cache.recent_keys, cache.recent_stamps,
                                                       cache.claims, cache.sets, cache.control),
                                      dict(BLOCK_R=INSERT_BLOCK, WAYS_=WAYS, POS_BITS=POSITION_BITS), device)
        self._move = launcher(_move_rows_kernel, (staging, n, gather, cache.recent_rows),
                                    dict(ROW_BYTES=rows, BLOCK=MOVE_BLOCK), device)
        # The serve side's arguments are the host path's own buffers and the cache's: checked once here.
        self._serve_fast = self._serve.fast and self._insert.fast and self._move.fast
        # The runners take pointers as integers (compiled_launch.py: a tensor costs a driver query a
        # call); the cache's buffers live as long as it does (disarmed, every kernel's loads are masked).
        self._fixed_keys, self._fixed_rows = cache.fixed_keys.data_ptr(), cache.fixed_rows.data_ptr()
        self._recent = (cache.recent_keys.data_ptr(), cache.recent_stamps.data_ptr(), cache.claims.data_ptr())
        self._recent_rows, self._control = cache.recent_rows.data_ptr(), cache.control.data_ptr()
        self._compiled_rows = (cache.row_lo, cache.row_hi)

    def _classify_args(self, ids, n, row_lo, row_hi, slotmap, gather) -> tuple:
        cache = self.cache
        return (ids, n, row_lo, row_hi, cache.fixed_keys, cache.fixed_count, self._search, cache.recent_keys,
                cache.recent_stamps, cache.claims, cache.sets, cache.control, slotmap, gather)

    def classify(self, ids, n, row_lo, row_hi, slotmap, gather, stream, raw_stream) -> None:
        """Enqueue the classify kernel on ``stream`` (the prefetch stream; ``raw_stream`` its CUstream).
        Only the ids come from the caller: their dtype and alignment, and the rows, decide the runner."""
        launch, grid = self._classify.get(ids.dtype), triton.cdiv(n, CLASSIFY_BLOCK)
        address = ids.data_ptr()
        if launch is not None and launch.fast and address % 16 == 0 and (row_lo, row_hi) == self._compiled_rows:
            keys, stamps, claims = self._recent
            launch.unchecked(grid, raw_stream, address, n, row_lo, row_hi, self._fixed_keys, self.cache.fixed_count,
                             self._search, keys, stamps, claims, self.cache.sets, self._control, slotmap.data_ptr(),
                             gather.data_ptr())
            return
        launch = launch or self._classify[torch.int64]  # another dtype: its JIT launch
        launch(grid, stream, raw_stream, *self._classify_args(ids, n, row_lo, row_hi, slotmap, gather))

    def serve(self, staging, out, n, slotmap, gather, stream, raw_stream) -> None:
        """Enqueue serve, insert and move on ``stream``, after the staged rows' copy."""
        cache = self.cache
        grids = (triton.cdiv(n, SERVE_BLOCK), triton.cdiv(n, INSERT_BLOCK), triton.cdiv(n * cache.row_bytes, MOVE_BLOCK))
        if self._serve_fast and out.dtype is self.out_dtype:
            staged, slots, moves = staging.data_ptr(), slotmap.data_ptr(), gather.data_ptr()
            keys, stamps, claims = self._recent
            self._serve.unchecked(grids[0], raw_stream, staged, out.data_ptr(), n, slots, self._fixed_rows,
                                  self._recent_rows, self._control)
            self._insert.unchecked(grids[1], raw_stream, n, moves, slots, keys, stamps, claims, cache.sets,
                                   self._control)
            self._move.unchecked(grids[2], raw_stream, staged, n, moves, self._recent_rows)
            return
        self._serve(grids[0], stream, raw_stream, staging, out, n, slotmap, cache.fixed_rows, cache.recent_rows,
                    cache.control)
        self._insert(grids[1], stream, raw_stream, n, gather, slotmap, cache.recent_keys, cache.recent_stamps,
                     cache.claims, cache.sets, cache.control)
        self._move(grids[2], stream, raw_stream, staging, n, gather, cache.recent_rows)
