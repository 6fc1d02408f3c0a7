"""Bit-exact comparisons of lookup output against the independent numpy reference."""
from __future__ import annotations

import numpy as np
import torch

from engram_client.lookup.reference import e4m3_to_float64, e8m0_to_float64, reference_bf16_bits, same_bf16


def bf16_bits(out: torch.Tensor) -> np.ndarray:
    return out.detach().cpu().contiguous().view(torch.int16).numpy().view(np.uint16)


def assert_bf16_exact(out: torch.Tensor, weight: np.ndarray, scale: np.ndarray) -> None:
    expected = reference_bf16_bits(weight, scale)
    actual = bf16_bits(out.reshape(-1, weight.shape[1]))
    assert actual.shape == expected.shape
    differ = ~same_bf16(actual, expected)
    assert not differ.any(), f"{differ.sum()} of {differ.size} values differ"


def assert_float32_exact(out: torch.Tensor, weight: np.ndarray, scale: np.ndarray) -> None:
    with np.errstate(over="ignore", invalid="ignore"):
        expected = (e4m3_to_float64(weight) * np.repeat(e8m0_to_float64(scale), 32, axis=1)).astype(np.float32)
    actual = out.detach().cpu().reshape(expected.shape).numpy()
    assert np.array_equal(np.isnan(actual), np.isnan(expected))
    assert np.array_equal(actual[~np.isnan(actual)], expected[~np.isnan(expected)])
