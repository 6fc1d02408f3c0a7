"""The HBM hot-row cache of one layer table, in front of the host gather.

It holds packed rows (the table's own bytes, ``row_bytes`` each: twice as many as dequantized
bf16 rows in the same memory) in two parts:

- the fixed part: the layer's most frequent rows from the node's frequency list (the daemon
  publishes it with the table: ``engramd serve --hot-rows``), loaded once at attach, sorted by id;
- the recency part: a set-associative table (WAYS ways a set) that every call's misses fill,
  the least recently used way of a set giving way.

A lookup with the cache (host_lookup.py) runs, in prefetch-stream order::

    ids ──> classify (kernel) ──> gather ids: hits marked SKIP_ID ──> D2H ──> workers fetch misses only
              │  slotmap: fixed row / recency slot / staging row              │
              │                                                              v
              │                                         pinned staging ──> copy engine ──> HBM staging
              v                                                                               │
    out <── serve (kernel): hits from the cache, misses from HBM staging; misses fill ways <──┘

Hits and misses are told apart on the GPU, in stream order (hot_cache_kernels.py has the
rules that keep it exact), so the gather never needs to know a count before it runs: the
number of misses is data-dependent, but the gather simply skips the marked ids, and the copy
and the kernels run on fixed sizes.  No host synchronization, capturable in CUDA graphs, and no
SM waits on PCIe (serve runs once the copy engine has moved the rows).

Sizes: ``budget_bytes`` of HBM; with a list, up to half for the fixed part (8 bytes of key and
``row_bytes`` a row), the rest for the recency part (16 bytes of key and stamp a slot), in a power
of two of sets.  ``disarm()`` (close, refresh) sets the device word that makes graphs captured
with this cache treat every id as a miss, then frees the rows.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import torch

from ...core.errors import EngramError
log = logging.getLogger("engram_client")
WAYS = 8
POSITION_BITS = 26  # a call's ids, in the kernels' claims; the call's sequence number has the 37 bits above
MAX_CALL_IDS = (1 << POSITION_BITS) - 1
SKIP_ID = -1  # a hit, for the C gather (_gather_job.h's SKIP_ID)
FIXED_SHARE = 0.5
LOAD_CHUNK_ROWS = 1 << 16  # rows of the fixed part gathered and copied at a time (17 MiB of 264-byte rows)


def _floor_pow2(x: int) -> int:
    return 1 << (x.bit_length() - 1) if x >= 1 else 0


def part_sizes(budget_bytes: int, row_bytes: int, listed: int) -> tuple[int, int]:
    """(rows of the fixed part, sets of the recency part) of a layer's cache of ``budget_bytes``
    whose list offers ``listed`` rows: the list takes up to FIXED_SHARE of the budget (row_bytes + 8
    a row), the recency part the rest (row_bytes + 16 a slot), in a power of two of sets."""
    fixed = min(listed, int(budget_bytes * FIXED_SHARE) // (row_bytes + 8))
    return fixed, _floor_pow2((budget_bytes - fixed * (row_bytes + 8)) // (row_bytes + 16) // WAYS)


class HbmRowCache:
    def __init__(self, budget_bytes: int, head_dim: int, row_bytes: int, row_lo: int, row_hi: int,
                 device: torch.device, ranked: np.ndarray | None = None):
        if not isinstance(budget_bytes, int) or budget_bytes < 1:
            raise EngramError(f"hot-row cache budget must be a positive number of bytes, got {budget_bytes!r}")
        self.head_dim, self.row_bytes, self.device = head_dim, row_bytes, device
        self.budget_bytes = budget_bytes
        self.row_lo, self.row_hi = row_lo, row_hi  # the rows its kernels are compiled for (hot_cache_kernels.py)
        ranked = np.empty(0, dtype=np.int64) if ranked is None else np.asarray(ranked, dtype=np.int64)
        ranked = ranked[(ranked >= row_lo) & (ranked < row_hi)]  # a rank's registered range only
        fixed_count, self.sets = part_sizes(budget_bytes, row_bytes, len(ranked))
        fixed_keys = np.sort(ranked[:fixed_count])
        if self.sets < 1:
            raise EngramError(f"a hot-row cache of {budget_bytes} bytes has no room for one recency set of {WAYS} "
                              f"rows of {row_bytes} bytes; give it at least {WAYS * (row_bytes + 16)} bytes a layer")
        self.fixed_count = len(fixed_keys)
        self._fixed_keys_host = fixed_keys
        slots = self.sets * WAYS
        with torch.cuda.device(device):
            self.fixed_keys = torch.from_numpy(fixed_keys if len(fixed_keys) else np.zeros(1, np.int64)).to(device)
            self.fixed_rows = torch.zeros((max(1, self.fixed_count), row_bytes), dtype=torch.uint8, device=device)
            self.recent_keys = torch.full((slots,), -1, dtype=torch.int64, device=device)
            self.recent_stamps = torch.zeros(slots, dtype=torch.int64, device=device)
            self.recent_rows = torch.zeros((slots, row_bytes), dtype=torch.uint8, device=device)
            self.claims = torch.zeros(self.sets, dtype=torch.int64, device=device)
            # [committed sequence number, this call's, armed, spare]: kept alive by captured graphs.
            self.control = torch.tensor([0, 0, 1, 0], dtype=torch.int64, device=device)
        self.load_seconds = 0.0

    @property
    def recent_capacity(self) -> int:
        return self.sets * WAYS

    @property
    def nbytes(self) -> int:
        return (self.fixed_count * (self.row_bytes + 8) + self.recent_capacity * (self.row_bytes + 16)
                + self.sets * 8)

    @property
    def armed(self) -> bool:
        return self.fixed_rows is not None

    def load_fixed(self, pool, host_rows: torch.Tensor, row_lo: int, row_hi: int, stream) -> None:
        """Fetch the fixed part's rows from the host mapping with the client's gather pool, a chunk at a
        time through pinned memory, and wait for them (attach time, not a lookup's)."""
        if not self.fixed_count:
            return
        started = time.monotonic()
        chunk = min(LOAD_CHUNK_ROWS, self.fixed_count)
        buffers = [torch.empty((chunk, self.row_bytes), dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        done = [None, None]
        keys = self._fixed_keys_host
        with torch.cuda.stream(stream):
            for index, start in enumerate(range(0, self.fixed_count, chunk)):
                ids = np.ascontiguousarray(keys[start:start + chunk])
                rows, event = buffers[index % 2], done[index % 2]
                if event is not None:
                    event.synchronize()  # that buffer's last copy has left it
                bad = pool.gather(host_rows.data_ptr(), row_lo, row_hi, self.row_bytes, ids.ctypes.data, True,
                                  len(ids), rows.data_ptr(), 0)
                if bad:
                    raise EngramError(f"{bad} rows of the frequency list are outside rows [{row_lo}, {row_hi})")
                self.fixed_rows[start:start + len(ids)].copy_(rows[:len(ids)], non_blocking=True)
                done[index % 2] = torch.cuda.Event()
                done[index % 2].record(stream)
        stream.synchronize()
        self.load_seconds = time.monotonic() - started

    def check_call(self, n: int) -> None:
        if n > MAX_CALL_IDS:
            raise EngramError(f"a lookup through the hot-row cache takes at most {MAX_CALL_IDS} ids, got {n}; "
                              "split the call")

    def disarm(self, stream) -> None:
        """Graphs captured with this cache treat every id as a miss from now on; its rows are freed.
        Called with the prefetch stream drained (close, refresh)."""
        if not self.armed:
            return
        with torch.cuda.stream(stream):
            self.control[2].fill_(0)
        stream.synchronize()
        # The kernels read nothing else while disarmed (their loads are masked by the flag).
        self.fixed_rows = self.recent_rows = self.fixed_keys = self.recent_keys = None
        self.recent_stamps = self.claims = None

    def describe(self) -> dict:
        return {"bytes": self.nbytes if self.armed else 0, "fixed_rows": self.fixed_count if self.armed else 0,
                "recent_rows": self.recent_capacity if self.armed else 0, "load_seconds": round(self.load_seconds, 4)}


def cache_for_layer(budget_bytes: int, layout, host_rows: torch.Tensor, row_lo: int, row_hi: int,
                    device: torch.device, pool, stream, ranked: np.ndarray | None) -> HbmRowCache:
    """One layer's cache, its fixed part loaded from ``ranked`` (the frequency list's ids for the
    layer, most frequent first; None: no list, the recency part alone)."""
    cache = HbmRowCache(budget_bytes, layout.head_dim, layout.row_bytes, row_lo, row_hi, device, ranked)
    cache.load_fixed(pool, host_rows, row_lo, row_hi, stream)
    if cache.fixed_count:
        log.info("layer %d: hot-row cache of %.2f GiB, %d rows of the frequency list loaded in %.3f s, %d recency "
                 "slots", layout.layer, cache.nbytes / 2**30, cache.fixed_count, cache.load_seconds,
                 cache.recent_capacity)
    return cache


def cache_for_view(config, view, mapped, device: torch.device, pool, stream) -> HbmRowCache | None:
    """The cache of one layer's view of a mapped generation: its share of the client's
    ``hot_cache_bytes`` and its rows of the generation's hot-row list; None without a budget,
    on the UVA path (it keeps its own), or without a gather pool."""
    if not config.hot_cache_bytes or config.path == "uva" or pool is None:
        return None
    budget = layer_budgets(config.hot_cache_bytes, {k: v.hi - v.lo for k, v in mapped.layers.items()})
    layer = view.layout.layer
    hot_list = getattr(mapped, "hot_list", None)
    ranked = hot_list.ranked(layer) if hot_list is not None and layer in hot_list.layers else None
    return cache_for_layer(budget[layer], view.layout, view.host_view, view.lo, view.hi, device, pool, stream, ranked)


def layer_budgets(total_bytes: int, rows: dict[int, int]) -> dict[int, int]:
    """A rank's cache budget split across its layers by their rows (registered ranges)."""
    whole = sum(rows.values()) or 1
    return {layer: total_bytes * count // whole for layer, count in rows.items()}


def cache_report(pool, caches) -> dict:
    """The counters a heartbeat carries (protocol 1.4): totals over the client's layers."""
    hits, misses, fetched = pool.cache_counts if pool is not None else (0, 0, 0)
    described = [cache.describe() for cache in caches]
    return {"hits": hits, "misses": misses, "fetched": fetched,
            "bytes": sum(d["bytes"] for d in described), "fixed_rows": sum(d["fixed_rows"] for d in described),
            "recent_rows": sum(d["recent_rows"] for d in described)}
