"""A cache of the hottest rows in GPU memory, learned from the ids this client looks up.

N-gram ids are Zipfian: a few rows are wanted over and over.  The cache keeps the
``capacity`` most frequent rows seen in the last ``window`` calls, already
dequantized, sorted by row id, so a lookup finds them with one searchsorted and
never sends them over PCIe again.  The table is immutable for its generation, so a
cached row can never be stale.

Off by default: its bytes come out of the engine's HBM (the KV cache).  Refreshing
(counting, choosing, fetching the new rows) runs on the prefetch stream every
``refresh_every`` calls and waits for it once; lookups themselves never wait on it.  It
fetches rows through the UVA launcher with the table's LookupConfig.
"""
from __future__ import annotations

from collections import deque

import torch


class HotRowCache:
    def __init__(self, capacity: int, head_dim: int, out_dtype: torch.dtype, device: torch.device,
                 window: int = 16, refresh_every: int = 16):
        if capacity < 1:
            raise ValueError(f"hot-row cache capacity must be at least one row, got {capacity}")
        self.capacity = capacity
        self.head_dim = head_dim
        self.out_dtype = out_dtype
        self.device = device
        self.refresh_every = refresh_every
        self._seen: deque[torch.Tensor] = deque(maxlen=window)
        self.clear()

    def clear(self) -> None:
        """Forget every cached row and every id seen."""
        self.keys = torch.empty(0, dtype=torch.int64, device=self.device)  # sorted row ids
        self.rows = torch.empty((0, self.head_dim), dtype=self.out_dtype, device=self.device)
        self._seen.clear()
        self._calls = 0
        self.refreshes = 0

    @classmethod
    def for_budget(cls, budget_bytes: int, head_dim: int, out_dtype: torch.dtype, device: torch.device,
                   **kwargs) -> "HotRowCache":
        row_bytes = head_dim * torch.empty((), dtype=out_dtype).element_size()
        return cls(max(1, budget_bytes // row_bytes), head_dim, out_dtype, device, **kwargs)

    @classmethod
    def for_config(cls, config, layers: int, head_dim: int, device: torch.device) -> "HotRowCache | None":
        """A layer's share of ``hot_cache_bytes`` where the client's lookups take the UVA path, else None."""
        if not config.hot_cache_bytes or config.path != "uva":
            return None
        return cls.for_budget(config.hot_cache_bytes // layers, head_dim, config.out_dtype, device,
                              refresh_every=config.hot_cache_refresh_every)

    @property
    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size() + self.keys.numel() * 8

    def observe(self, ids: torch.Tensor) -> bool:
        """Remember a call's ids (on the current stream); True when a refresh is due."""
        self._seen.append(ids.to(torch.int64, copy=True))
        self._calls += 1
        return self._calls % self.refresh_every == 0

    def slots(self, ids: torch.Tensor) -> torch.Tensor | None:
        """For each id, its row in ``rows``, or -1; None while the cache is empty."""
        if self.keys.numel() == 0:
            return None
        position = torch.searchsorted(self.keys, ids.to(torch.int64)).clamp_(max=self.keys.numel() - 1)
        return torch.where(self.keys[position] == ids, position, -1)

    def refresh(self, rows_view: torch.Tensor, row_lo: int, row_hi: int, row_bytes: int, config) -> None:
        """Re-choose the hottest rows seen and fetch them from ``rows_view`` (rows [row_lo, row_hi))
        with the UVA lookup kernel, launched as ``config`` (a LookupConfig) says."""
        from .lookup_kernel import launch_lookup

        if not self._seen:
            return
        seen = torch.cat(list(self._seen))
        seen = seen[(seen >= row_lo) & (seen < row_hi)]
        if seen.numel() == 0:
            return
        unique, counts = torch.unique(seen, return_counts=True)
        k = min(self.capacity, unique.numel())
        keys = torch.sort(unique[torch.topk(counts, k, sorted=False).indices]).values
        rows = torch.empty((k, self.head_dim), dtype=self.out_dtype, device=self.device)
        scratch = torch.zeros(1, dtype=torch.int32, device=self.device)  # every key is in range
        launch_lookup(rows_view, keys, rows, scratch, row_lo, row_hi, self.head_dim, row_bytes, config)
        self.keys, self.rows = keys, rows
        self.refreshes += 1
