"""The GPU n-gram hash: one Triton kernel from token ids to row ids, no host sync.

Each program takes BLOCK tokens.  It finds each token's sequence by a binary search
over ``starts`` (SEARCH_STEPS rounds), builds the token's window of compressed ids
(its predecessors in the sequence, else ``history``, else the pad id), and for every
layer and order writes ``mix % prime + offset`` for all heads of the order as one
[BLOCK, HEADS] tile.  The arithmetic is the CPU hash's (int64 products and XOR, no
overflow by construction; mix >= 0, so the remainder is the same in C and Triton).

A window holding an id outside [0, vocab) (or below -1 in history) is never used as
an address: the token gets row -1 in every column, which a lookup refuses.

The launcher checks everything the kernel assumes before it launches.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..core.errors import TokenIdsError

BLOCK = 128


@triton.jit
def _window_id(tokens_ptr, history_ptr, map_ptr, t, seq, pos, live, vocab, pad_id, K: tl.constexpr,
               MAX_NGRAM: tl.constexpr, HAS_HISTORY: tl.constexpr):
    """The compressed id of each token's K-th predecessor, and whether the raw id was valid."""
    inside = pos >= K
    raw = tl.load(tokens_ptr + tl.where(inside, t - K, 0), mask=live & inside, other=0).to(tl.int64)
    if HAS_HISTORY:
        earlier = tl.load(history_ptr + seq.to(tl.int64) * (MAX_NGRAM - 1) + (MAX_NGRAM - 1) + pos - K,
                          mask=live & (pos < K), other=-1)
        raw = tl.where(inside, raw, earlier)
    else:
        raw = tl.where(inside, raw, -1)
    valid = (raw < vocab) & ((raw >= 0) | ((raw == -1) & (pos < K)))
    compressed = tl.load(map_ptr + tl.where(valid & (raw >= 0), raw, 0), mask=live & valid & (raw >= 0), other=0)
    return tl.where(raw >= 0, compressed.to(tl.int64), pad_id), valid


@triton.jit
def _ngram_hash_kernel(tokens_ptr, n_tokens, starts_ptr, n_seqs, history_ptr, map_ptr, vocab, pad_id, mult_ptr,
                       primes_ptr, offsets_ptr, out_ptr, n_layers, MAX_NGRAM: tl.constexpr, HEADS: tl.constexpr,
                       HEADS_POW2: tl.constexpr, HAS_HISTORY: tl.constexpr, SEARCH_STEPS: tl.constexpr,
                       BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = t < n_tokens
    # Invariant: starts[lo] <= t < starts[hi] (starts[n_seqs] taken as infinity).
    lo = tl.zeros([BLOCK], dtype=tl.int64)
    hi = tl.zeros([BLOCK], dtype=tl.int64) + n_seqs
    for _ in tl.static_range(SEARCH_STEPS):
        mid = (lo + hi) // 2
        open_ = hi - lo > 1
        begin = tl.load(starts_ptr + mid, mask=live & open_, other=0)
        right = open_ & (begin <= t)
        lo = tl.where(right, mid, lo)
        hi = tl.where(open_ & ~right, mid, hi)
    seq = lo
    pos = t - tl.load(starts_ptr + seq, mask=live, other=0)
    ok = live
    for k in tl.static_range(MAX_NGRAM):
        _unused_id, valid = _window_id(tokens_ptr, history_ptr, map_ptr, t, seq, pos, live, vocab, pad_id, k,
                                       MAX_NGRAM, HAS_HISTORY)
        ok = ok & valid
    heads_total = (MAX_NGRAM - 1) * HEADS
    h = tl.arange(0, HEADS_POW2)
    h_live = h < HEADS
    for layer in range(n_layers):
        mix = tl.zeros([BLOCK], dtype=tl.int64)
        for k in tl.static_range(MAX_NGRAM):
            # Distinct names: Triton types a variable per name, and these two hold different types.
            x, _unused_valid = _window_id(tokens_ptr, history_ptr, map_ptr, t, seq, pos, live, vocab, pad_id, k,
                                          MAX_NGRAM, HAS_HISTORY)
            mix = mix ^ (x * tl.load(mult_ptr + layer * MAX_NGRAM + k))
            if k >= 1:
                col = layer * heads_total + (k - 1) * HEADS + h
                prime = tl.load(primes_ptr + col, mask=h_live, other=1)
                offset = tl.load(offsets_ptr + col, mask=h_live, other=0)
                rows = mix[:, None] % prime[None, :] + offset[None, :]
                rows = tl.where(ok[:, None], rows, -1)
                tl.store(out_ptr + t[:, None] * (n_layers * heads_total) + col[None, :],
                         rows.to(out_ptr.dtype.element_ty), mask=live[:, None] & h_live[None, :])


def _check(tokens, starts, history, token_map, multipliers, primes, offsets, max_ngram, heads_per_order, out):
    device = tokens.device
    layers = multipliers.shape[0]
    expected = {"starts": (starts, torch.int64, None), "token_map": (token_map, torch.int32, None),
                "multipliers": (multipliers, torch.int64, (layers, max_ngram)),
                "primes": (primes, torch.int64, (layers, (max_ngram - 1) * heads_per_order)),
                "offsets": (offsets, torch.int64, (layers, (max_ngram - 1) * heads_per_order)),
                "out": (out, out.dtype, (tokens.numel(), layers, (max_ngram - 1) * heads_per_order))}
    if history is not None:
        expected["history"] = (history, torch.int64, (starts.numel(), max_ngram - 1))
    for name, (tensor, dtype, shape) in expected.items():
        if tensor.device != device or tensor.dtype != dtype or not tensor.is_contiguous() or \
                (shape is not None and tuple(tensor.shape) != shape):
            raise TokenIdsError(f"hash kernel: {name} must be a contiguous {dtype} tensor on {device}"
                                f"{'' if shape is None else f' of shape {shape}'}, got {tensor.dtype} "
                                f"{tuple(tensor.shape)} on {tensor.device}")
    if out.dtype not in (torch.int32, torch.int64) or tokens.dtype not in (torch.int32, torch.int64):
        raise TokenIdsError(f"hash kernel: tokens {tokens.dtype} / out {out.dtype} must be int32 or int64")
    if not 2 <= max_ngram <= 32:
        raise TokenIdsError(f"hash kernel: max_ngram {max_ngram} is outside [2, 32]")


def launch_ngram_hash(tokens: torch.Tensor, starts: torch.Tensor, history: torch.Tensor | None,
                      token_map: torch.Tensor, pad_id: int, multipliers: torch.Tensor, primes: torch.Tensor,
                      offsets: torch.Tensor, max_ngram: int, heads_per_order: int, out: torch.Tensor) -> None:
    """Fill ``out`` [T, L, heads] on the current stream (``starts`` already checked on the host)."""
    _check(tokens, starts, history, token_map, multipliers, primes, offsets, max_ngram, heads_per_order, out)
    if tokens.numel() == 0:
        return
    n_seqs = starts.numel()
    grid = (triton.cdiv(tokens.numel(), BLOCK),)
    _ngram_hash_kernel[grid](tokens, tokens.numel(), starts, n_seqs, history if history is not None else starts,
                             token_map, token_map.numel(), pad_id, multipliers, primes, offsets, out,
                             multipliers.shape[0], MAX_NGRAM=max_ngram, HEADS=heads_per_order,
                             HEADS_POW2=triton.next_power_of_2(heads_per_order), HAS_HISTORY=history is not None,
                             SEARCH_STEPS=max(1, n_seqs.bit_length()), BLOCK=BLOCK)
