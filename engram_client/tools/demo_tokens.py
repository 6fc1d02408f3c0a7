"""The demo rank's token check: packed sequences of token ids in, every layer's rows out.

The demo table carries a token map (engramd.loading.token_map.demo_token_map), so a demo rank
exercises the whole path a model's forward takes: ``client.prefetch_tokens`` hashes the
tokens and starts every layer's lookup; the rows that come back are compared bit for bit
with the demo's reference rows at the hasher's row ids.
"""
from __future__ import annotations

import numpy as np
import torch


def check_tokens(client, rng: np.random.Generator, seed: int, check, tokens: int = 2048) -> tuple[int, int]:
    """(rows checked, mismatches) for one batch of packed random sequences; ``check`` is the demo
    rank's row comparison."""
    hasher = client.hasher
    token_ids = torch.from_numpy(rng.integers(0, hasher.vocab, size=tokens)).to(client.device)
    starts = sorted({0, *rng.integers(1, tokens, size=7).tolist()})
    rows = hasher.row_ids(token_ids, starts).cpu().numpy()
    handles = client.prefetch_tokens(token_ids, seq_starts=starts)
    checked = mismatches = 0
    for index, layer in enumerate(hasher.layers):
        table = client.table(layer)
        out = handles[layer].wait()
        mismatches += check(table, out.reshape(-1, table.head_dim), rows[:, index].reshape(-1), seed)
        checked += rows[:, index].size
    return checked, mismatches
