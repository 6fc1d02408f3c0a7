"""The host path's only GPU kernel: dequantize rows already staged in HBM, in Triton.

The host gather has copied packed rows (FP8 values then UE8M0 scales, ``row_bytes`` each)
into a contiguous device buffer; this kernel turns row r into out[r], with the arithmetic of
the UVA kernel (``row_fetch.fetch_rows``: fp8 -> fp32, times a power of two built from the scale's
bits, one rounding), so every path gives the same bits as engram_client.lookup.dequant.  A row the
gather zeroed (an id out of range) comes out as zeros.

The grid is persistent and capped (``programs``): a lookup prefetched beside the model
would otherwise spread thousands of short programs over every SM, between the model's own
blocks; a few programs looping over the rows finish well inside a prefetch and leave the
other SMs alone (docs/history/benchmarks-2026-11.md, "The host-gather path").

A lookup's host time matters (it is spent on the engine's thread), so StagedDequant launches
the kernel through its compiled runner (compiled_launch.py), skipping the JIT's per-call
argument binding; it proves that runner against the ordinary launch first and keeps the
ordinary launch where the runner is not usable with this Triton.
"""
from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

from ...core.errors import EngramError
from ..compiled_launch import CompiledLaunch
from ..row_fetch import OUT_DTYPES, fetch_rows

log = logging.getLogger("engram_client")
BLOCK_ROWS = 16
# Programs of one dequant launch; None: one per block of rows (docs/BENCHMARKS.md has the measure).
DEQUANT_PROGRAMS: int | None = None


@triton.jit
def _dequant_staged_kernel(staging_ptr, out_ptr, n_rows, ROW_BYTES: tl.constexpr, HEAD_DIM: tl.constexpr,
                           BLOCK_R: tl.constexpr, OUT_DTYPE: tl.constexpr):
    cols = tl.arange(0, HEAD_DIM)
    for block in range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_R), tl.num_programs(0)):
        r = block.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
        in_call = r < n_rows
        values = fetch_rows(staging_ptr, r, in_call, ROW_BYTES, HEAD_DIM).to(OUT_DTYPE)
        tl.store(out_ptr + r[:, None] * HEAD_DIM + cols[None, :], values, mask=in_call[:, None])


class StagedDequant:
    """dequantize(staging, out, n): enqueue the kernel on the current stream (no checks per call:
    the host path owns both buffers and sized them)."""

    def __init__(self, head_dim: int, row_bytes: int, out_dtype: torch.dtype, device: torch.device,
                 programs: int | None = DEQUANT_PROGRAMS, block_rows: int = BLOCK_ROWS):
        if out_dtype not in OUT_DTYPES:
            raise EngramError(f"out dtype must be bfloat16 or float32, got {out_dtype}")
        if head_dim % 32 or head_dim & (head_dim - 1) or row_bytes != head_dim + head_dim // 32:
            raise EngramError(f"head_dim {head_dim} with {row_bytes}-byte rows is not a packed layout this "
                              "kernel handles (a power of two, a multiple of 32, one scale byte per 32 values)")
        if programs is not None and (not isinstance(programs, int) or programs < 1):
            raise EngramError(f"dequant programs must be a positive int or None, got {programs!r}")
        if not isinstance(block_rows, int) or block_rows < 1 or block_rows & (block_rows - 1):
            raise EngramError(f"dequant block_rows must be a power of two, got {block_rows!r}")
        self.head_dim, self.row_bytes, self.device = head_dim, row_bytes, device
        self.programs, self.block_rows = programs, block_rows
        self._constants = dict(ROW_BYTES=row_bytes, HEAD_DIM=head_dim, BLOCK_R=block_rows,
                               OUT_DTYPE=OUT_DTYPES[out_dtype])
        self.out_dtype = out_dtype
        self._runner = None
        self.fast = False
        self._resolve()

    def grid(self, n: int) -> int:
        blocks = (n + self.block_rows - 1) // self.block_rows
        return blocks if self.programs is None else max(1, min(blocks, self.programs))

    def _launch_generic(self, staging: torch.Tensor, out: torch.Tensor, n: int) -> None:
        _dequant_staged_kernel[(self.grid(n),)](staging, out, n, **self._constants)

    def _resolve(self) -> None:
        """Compile now (never under a capture) and prove the compiled runner (compiled_launch.py)
        bit for bit against the ordinary launch, on rows that cover every byte value."""
        n = 300 + 7 * self.block_rows  # more blocks than a small capped grid: the loop runs; not a multiple of 16
        staging = torch.randint(0, 256, (n * self.row_bytes,), dtype=torch.uint8, device=self.device)
        staging.view(n, self.row_bytes)[:, self.head_dim:] = torch.randint(
            100, 150, (n, self.row_bytes - self.head_dim), dtype=torch.uint8, device=self.device)
        expected = torch.empty((n, self.head_dim), dtype=self.out_dtype, device=self.device)
        self._launch_generic(staging, expected, n)
        stream = torch.cuda.current_stream(self.device)
        try:
            launch = CompiledLaunch(_dequant_staged_kernel, (staging, expected, n), self._constants, self.device)
            if launch.fast:
                got = torch.full_like(expected, 7)
                launch.unchecked(self.grid(n), stream.cuda_stream, staging.data_ptr(), got.data_ptr(), n)
                stream.synchronize()
                bits = torch.int16 if got.element_size() == 2 else torch.int32
                if torch.equal(got.view(bits), expected.view(bits)):
                    self._runner, self.fast = launch, True
                    return
                log.debug("staged dequant keeps Triton's ordinary launch: the compiled runner's rows differ")
        except Exception as exc:  # any Triton without this runner: the ordinary launch serves
            stream.synchronize()
            log.debug("staged dequant keeps Triton's ordinary launch: %s", exc)

    def __call__(self, staging: torch.Tensor, out: torch.Tensor, n: int, stream: torch.cuda.Stream,
                 raw_stream: int) -> None:
        """Dequantize ``n`` staged rows into ``out`` on ``stream`` (``raw_stream``: its CUstream)."""
        if self._runner is not None:  # both buffers are the host path's own, n below 2**31: nothing to check
            self._runner.unchecked(self.grid(n), raw_stream, staging.data_ptr(), out.data_ptr(), n)
        else:
            with torch.cuda.stream(stream):
                self._launch_generic(staging, out, n)
