"""One packed row to bf16/fp32 inside a Triton kernel, shared by every kernel that dequantizes rows:
the UVA lookup (uva/lookup_kernel.py), the host path's staged dequant (host/dequant_kernel.py) and
the HBM row cache's serve (cache/kernels.py), so that the three cannot round differently.

A row is HEAD_DIM FP8-E4M3 bytes then one UE8M0 scale byte per 32 of them (core/layout.py); the
value is fp8 -> fp32 times 2^(scale - 127), built as a float's exponent bits: exact in fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

OUT_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}  # the torch dtypes a kernel may write


@triton.jit
def fetch_rows(table_ptr, ids, fetch, ROW_BYTES: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Rows ``ids`` (local row numbers) where ``fetch``, dequantized to fp32; zeros elsewhere."""
    base = tl.where(fetch, ids, 0) * ROW_BYTES
    cols = tl.arange(0, HEAD_DIM)
    w = tl.load(table_ptr + base[:, None] + cols[None, :], mask=fetch[:, None], other=0)
    s = tl.load(table_ptr + base[:, None] + HEAD_DIM + (cols // 32)[None, :], mask=fetch[:, None], other=127)
    values = w.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    s32 = s.to(tl.int32)
    bits = tl.where(s32 == 0, 0x00400000, tl.where(s32 == 255, 0x7FC00000, s32 << 23))
    return values * bits.to(tl.float32, bitcast=True)
