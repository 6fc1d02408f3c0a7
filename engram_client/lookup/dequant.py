"""FP8-E4M3 x UE8M0 -> bf16 dequantization of packed rows, in torch (the CPU path).

value = fp8 * 2^(scale - 127), computed in fp32 and rounded once to the output
dtype.  The power of two is built from its bits rather than with exp2, so it is
exact for every scale byte: 0 is 2^-127 (an fp32 subnormal), 255 is NaN.  The
GPU kernel does the same arithmetic, so both paths give the same bits.
"""
from __future__ import annotations

import torch

from ..core.layout import QUANT_BLOCK

E8M0_ZERO_BITS = 0x00400000  # 2^-127
E8M0_NAN_BITS = 0x7FC00000


def scale_factors(scale_bytes: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes (uint8) -> fp32 powers of two, exactly."""
    s = scale_bytes.to(torch.int32)
    bits = torch.where(s == 0, E8M0_ZERO_BITS, torch.where(s == 255, E8M0_NAN_BITS, s << 23))
    return bits.view(torch.float32)


def dequantize_rows(rows: torch.Tensor, head_dim: int, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Packed rows [n, head_dim + head_dim/32] (uint8) -> [n, head_dim] of ``out_dtype``."""
    n = rows.shape[0]
    values = rows[:, :head_dim].contiguous().view(torch.float8_e4m3fn).to(torch.float32)
    scales = scale_factors(rows[:, head_dim:])
    product = values.view(n, head_dim // QUANT_BLOCK, QUANT_BLOCK) * scales.unsqueeze(-1)
    return product.view(n, head_dim).to(out_dtype)
