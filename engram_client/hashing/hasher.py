"""NgramHasher: token ids in, Engram row ids out, on the CPU or the GPU, bit for bit alike.

    rows = client.hasher.row_ids(token_ids, seq_starts=[0, 700], history=None)
    # rows: [tokens, len(client.layers), heads], int32 where every layer has < 2**31 rows

``token_ids`` is a 1-D batch of packed sequences; ``seq_starts`` says where each
begins (default: one sequence), and each starts fresh: before its first token the
hash sees the pad id.  For decode, ``history`` [sequences, max_ngram - 1] gives each
sequence's previous tokens (oldest first, -1 where there were none), so new tokens
hash exactly as they would within the whole sequence.  Row ids include each head's
offset, so they index the layer's table directly.

Ids on the CPU are checked before anything is hashed (TokenIdsError names the first
bad one).  Ids on the GPU are hashed by one Triton kernel without a host sync: a
token whose window holds an id outside the vocabulary gets row -1 in every column,
which a lookup refuses (IdsOutOfRangeError when its handle is waited on).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..core.errors import HasherUnavailableError, TableFileError, TokenIdsError
from ..core.hashing_section import HashingSection
from ..core.layout import EngramConfig, LayerLayout
from .cpu import cpu_backend, hash_rows_cpu

INT32_ROWS = (1 << 31) - 1
STARTS_KEPT = 64  # distinct seq_starts kept on each device (decode repeats the same ones every step)


class NgramHasher:
    def __init__(self, section: HashingSection, token_map: np.ndarray, layouts: Sequence[LayerLayout]):
        layer_ids = tuple(layout.layer for layout in layouts)
        # A section that disagrees with the table's own layout is a damaged table.
        if layer_ids != section.layer_ids:
            raise TableFileError(f"the hashing section is for layers {list(section.layer_ids)}, the table has "
                                 f"{list(layer_ids)}")
        orders = section.max_ngram - 1
        heads = {len(layout.head_sizes) for layout in layouts}
        if len(heads) != 1 or heads.pop() % orders:
            raise TableFileError(f"head counts {[len(l.head_sizes) for l in layouts]} do not split into "
                                 f"{orders} n-gram orders")
        if len(token_map) != section.vocab:
            raise TableFileError(f"the token map has {len(token_map)} ids, the hashing section says {section.vocab}")
        self.section = section
        self.layers = layer_ids
        self.max_ngram = section.max_ngram
        self.heads = len(layouts[0].head_sizes)
        self.heads_per_order = self.heads // orders
        self.vocab = section.vocab
        self.compressed_vocab = section.compressed_vocab
        self.pad_id = section.pad_id
        self.token_map = np.ascontiguousarray(token_map, dtype=np.int32)
        self.multipliers = np.array(section.multipliers, dtype=np.int64).reshape(len(layer_ids), self.max_ngram)
        self.primes = np.array([layout.head_sizes for layout in layouts], dtype=np.int64)
        self.offsets = np.array([layout.head_offsets for layout in layouts], dtype=np.int64)
        rows = max(layout.rows for layout in layouts)
        self.row_dtype = torch.int32 if rows <= INT32_ROWS else torch.int64
        self._on_device: dict[torch.device, tuple[torch.Tensor, ...]] = {}
        self._zero_start = np.zeros(1, dtype=np.int64)
        self._starts_on_device: dict[tuple, torch.Tensor] = {}
        self._captured_starts: list[tuple[torch.Tensor, torch.Tensor]] = []

    available = True

    def __repr__(self) -> str:
        return (f"NgramHasher(layers={list(self.layers)}, max_ngram={self.max_ngram}, heads={self.heads}, "
                f"vocab={self.vocab}, compressed_vocab={self.compressed_vocab}, cpu_backend={cpu_backend()!r})")

    # -- checks ------------------------------------------------------------------------
    def _check_tokens(self, token_ids) -> torch.Tensor:
        if not isinstance(token_ids, torch.Tensor):
            raise TokenIdsError(f"token_ids must be a torch.Tensor, got {type(token_ids).__name__}")
        if token_ids.dtype not in (torch.int32, torch.int64):
            raise TokenIdsError(f"token_ids must be int32 or int64, got {token_ids.dtype}")
        if token_ids.dim() != 1:
            raise TokenIdsError(f"token_ids must be 1-D (packed sequences; say where each starts with "
                                f"seq_starts), got shape {tuple(token_ids.shape)}")
        return token_ids.contiguous()

    def _check_starts(self, seq_starts, count: int) -> np.ndarray:
        if seq_starts is None:
            return self._zero_start
        if isinstance(seq_starts, torch.Tensor):
            if seq_starts.device.type != "cpu":
                raise TokenIdsError("seq_starts must be on the CPU (a list or a CPU tensor): the hasher checks "
                                    "them before it launches anything")
            seq_starts = seq_starts.numpy()
        starts = np.asarray(seq_starts)
        if starts.ndim != 1 or starts.size == 0 or starts.dtype.kind not in "iu":
            raise TokenIdsError(f"seq_starts must be a non-empty 1-D list of integers, got {seq_starts!r:.80}")
        starts = starts.astype(np.int64)
        if starts[0] != 0 or (starts.size > 1 and not (np.diff(starts) > 0).all()) or \
                (count and starts[-1] >= count) or (not count and starts.size > 1):
            raise TokenIdsError(f"seq_starts must begin at 0 and increase strictly below the {count} tokens, "
                                f"got {starts.tolist()[:16]}")
        return starts

    def _check_history(self, history, sequences: int, device: torch.device) -> torch.Tensor | None:
        if history is None:
            return None
        if not isinstance(history, torch.Tensor) or history.dtype not in (torch.int32, torch.int64):
            raise TokenIdsError("history must be an int32 or int64 torch.Tensor")
        want = (sequences, self.max_ngram - 1)
        if tuple(history.shape) != want:
            raise TokenIdsError(f"history must have shape {want} (sequences, max_ngram - 1), "
                                f"got {tuple(history.shape)}")
        return history.to(device=device, dtype=torch.int64).contiguous()

    # -- hashing -----------------------------------------------------------------------
    def row_ids(self, token_ids: torch.Tensor, seq_starts=None, history: torch.Tensor | None = None) -> torch.Tensor:
        """Row ids [tokens, layers, heads] on the device of ``token_ids``."""
        tokens = self._check_tokens(token_ids)
        starts = self._check_starts(seq_starts, tokens.numel())
        history = self._check_history(history, starts.size, tokens.device)
        out = torch.empty((tokens.numel(), len(self.layers), self.heads), dtype=self.row_dtype, device=tokens.device)
        if tokens.device.type == "cuda":
            return self._row_ids_cuda(tokens, starts, history, out)
        bad = hash_rows_cpu(tokens.numpy(), starts, None if history is None else history.numpy(), self.token_map,
                            self.pad_id, self.multipliers, self.primes, self.offsets, self.max_ngram,
                            self.heads_per_order, out.numpy())
        if bad >= 0:
            raise self._bad_token_error(tokens, history, bad)
        return out

    def _bad_token_error(self, tokens: torch.Tensor, history: torch.Tensor | None, bad: int) -> TokenIdsError:
        if bad < tokens.numel():
            return TokenIdsError(f"token_ids[{bad}] is {int(tokens[bad])}, outside the tokenizer's vocabulary "
                                 f"[0, {self.vocab})")
        row, col = divmod(bad - tokens.numel(), self.max_ngram - 1)
        return TokenIdsError(f"history[{row}, {col}] is {int(history[row, col])}, neither -1 (no token) nor a "
                             f"token id in [0, {self.vocab})")

    def _device_tables(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        if device not in self._on_device:
            self._on_device[device] = tuple(torch.from_numpy(a).to(device) for a in
                                            (self.token_map, self.multipliers, self.primes, self.offsets))
        return self._on_device[device]

    def _device_starts(self, starts: np.ndarray, device: torch.device) -> torch.Tensor:
        """``starts`` on the device.  Kept (never evicted: a captured graph may read them) for up
        to STARTS_KEPT distinct ones made outside a capture, so decode copies nothing per step.
        A capture that needs new ones records a copy from pinned memory, read at every replay:
        that pinned source (and the graph's copy) live as long as the hasher."""
        key = (device, starts.tobytes())
        kept = self._starts_on_device.get(key)
        if kept is not None:
            return kept
        pinned = torch.from_numpy(starts).pin_memory()
        on_device = pinned.to(device, non_blocking=True)
        if torch.cuda.is_current_stream_capturing():
            self._captured_starts.append((pinned, on_device))
        elif len(self._starts_on_device) < STARTS_KEPT:
            self._starts_on_device[key] = on_device
        return on_device

    def _row_ids_cuda(self, tokens, starts, history, out) -> torch.Tensor:
        from .ngram_kernel import launch_ngram_hash

        token_map, multipliers, primes, offsets = self._device_tables(tokens.device)
        starts_dev = self._device_starts(starts, tokens.device)
        launch_ngram_hash(tokens, starts_dev, history, token_map, self.pad_id, multipliers, primes, offsets,
                          self.max_ngram, self.heads_per_order, out)
        return out


def hasher_for_config(config: EngramConfig, token_map: np.ndarray, compressed_vocab: int,
                      pad_token_id: int) -> NgramHasher:
    """A hasher for a config's geometry without a table (benchmarks, tests, offline tools)."""
    from ..core.layout import build_layout

    section = HashingSection.build(token_map, compressed_vocab, pad_token_id, config.max_ngram, config.layer_ids)
    return NgramHasher(section, section.token_map, build_layout(config))


class UnavailableHasher:
    """Stands in for the hasher where the served table has no token map; every use says why."""

    available = False

    def __init__(self, reason: str):
        self.reason = reason

    def __repr__(self) -> str:
        return f"UnavailableHasher({self.reason!r})"

    def __getattr__(self, name: str):
        if name.startswith("__"):  # copy, pickle and friends probe for these
            raise AttributeError(name)
        raise HasherUnavailableError(f"the hasher is unavailable: {self.reason}")
