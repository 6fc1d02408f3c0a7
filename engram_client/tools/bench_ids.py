"""The bench's synthetic row ids: the call sizes it times and fresh uniform or Zipf draws per call.

bench.py times every method at each of SIZES with ids from IdSampler (bench_text.py adds
a ``text`` distribution beside these two); benchmarks/lookups/grid.py and cache/text_distinct.py
draw from the same sampler.
"""
from __future__ import annotations

import torch

SIZES = (6144, 49152, 393216)  # decode of 256 tokens, prefill of 2K and 16K tokens, 24 heads
ZIPF_S = 1.1


class IdSampler:
    """Fresh ids per call: token t, head h -> a row of head h (uniform, or Zipf within the head).

    Zipf ranks are mapped to rows by r -> (a*r + b) mod p, a bijection since head sizes are
    prime: popular n-grams land at scattered rows, as hashing puts them."""

    def __init__(self, table, device, max_cdf_rows: int = 1 << 24):
        self.sizes = torch.tensor(table.head_sizes, device=device, dtype=torch.int64)
        self.offsets = torch.tensor(table.head_offsets, device=device, dtype=torch.int64)
        self.device = device
        n = min(int(self.sizes.max()), max_cdf_rows)
        weights = torch.arange(1, n + 1, device=device, dtype=torch.float64).pow(-ZIPF_S)
        self.cdf = (weights.cumsum(0) / weights.sum()).to(torch.float64)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(1234)

    def sample(self, rows: int, distribution: str) -> torch.Tensor:
        heads = torch.arange(rows, device=self.device) % len(self.sizes)
        size = self.sizes[heads]
        if distribution == "uniform":
            u = torch.rand(rows, device=self.device, dtype=torch.float64, generator=self.generator)
            local = (u * size).long().clamp_(max=size - 1)
        else:
            u = torch.rand(rows, device=self.device, dtype=torch.float64, generator=self.generator)
            rank = torch.searchsorted(self.cdf, u).clamp_(max=self.cdf.numel() - 1)
            local = (rank * 2654435761 + 97) % size
        return self.offsets[heads] + local
