"""An independent reference for dequantized rows, in numpy and float64.

Written from the formats' definitions, sharing no code with the lookup paths:
E4M3 (bias 7, no infinities, S.1111.111 is NaN, subnormals 2^-6 * m/8) times
UE8M0 (2^(e-127), 0xFF is NaN), rounded once to bf16 (round to nearest even on the
float32 bits).  Results are bf16 bit patterns as uint16.
"""
from __future__ import annotations

import numpy as np


def e4m3_to_float64(byte: np.ndarray) -> np.ndarray:
    byte = byte.astype(np.int64)
    sign = np.where(byte & 0x80, -1.0, 1.0)
    exponent = (byte >> 3) & 0xF
    mantissa = byte & 0x7
    normal = sign * (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0)
    subnormal = sign * (mantissa / 8.0) * 2.0 ** -6
    value = np.where(exponent == 0, subnormal, normal)
    return np.where((byte & 0x7F) == 0x7F, np.nan, value)


def e8m0_to_float64(byte: np.ndarray) -> np.ndarray:
    byte = byte.astype(np.int64)
    return np.where(byte == 0xFF, np.nan, np.exp2(byte - 127.0))


def float32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(values)
    return np.where(nan, 0x7FC0 | ((bits >> 16) & 0x8000), rounded).astype(np.uint16)


def reference_bf16_bits(weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """weight [n, d] E4M3 bytes, scale [n, d/32] UE8M0 bytes -> bf16 bits [n, d] (uint16)."""
    d = weight.shape[1]
    factors = np.repeat(e8m0_to_float64(scale), 32, axis=1)[:, :d]
    with np.errstate(over="ignore", invalid="ignore"):
        exact = e4m3_to_float64(weight) * factors  # exact: 4 significant bits times a power of two
        as_float32 = exact.astype(np.float32)  # exact too, except overflow to inf as fp32 would
    return float32_to_bf16_bits(as_float32)


def same_bf16(actual_bits: np.ndarray, expected_bits: np.ndarray) -> np.ndarray:
    """Element-wise equality of bf16 bit patterns, any NaN equal to any NaN."""
    def is_nan(b):
        return ((b & 0x7F80) == 0x7F80) & ((b & 0x007F) != 0)
    return (actual_bits == expected_bits) | (is_nan(actual_bits) & is_nan(expected_bits))
