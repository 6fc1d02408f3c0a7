"""The HBM row cache of one layer table, in front of both lookup paths (the host gather, the UVA kernel).

It holds packed rows (the table's own bytes, ``row_bytes`` each: twice as many as dequantized
bf16 rows in the same memory) in two parts:

- the fixed part: the layer's most frequent rows from the node's frequency list (the daemon
  publishes it with the table: ``engramd serve --hot-rows``), loaded once at attach, sorted by id;
- the recency part: a set-associative table (WAYS ways a set) that every call's misses fill,
  the least recently used way of a set giving way.

A lookup with the cache on the host path (host/host_lookup.py) runs, in prefetch-stream order::

    ids ──> classify (kernel) ──> gather ids: hits marked SKIP_ID ──> D2H ──> workers fetch misses only
              │  slotmap: fixed row / recency slot / staging row              │
              │                                                              v
              │                                         pinned staging ──> copy engine ──> HBM staging
              v                                                                               │
    out <── serve (kernel): hits from the cache, misses from HBM staging; misses fill ways <──┘

Hits and misses are told apart on the GPU, in stream order (kernels.py has the
rules that keep it exact), so the gather never needs to know a count before it runs: the
number of misses is data-dependent, but the gather simply skips the marked ids, and the copy
and the kernels run on fixed sizes.  No host synchronization, capturable in CUDA graphs, and no
SM waits on PCIe (serve runs once the copy engine has moved the rows).

The UVA path (uva/cached_lookup.py) runs the same kernels on the same prefetch stream, with one
difference: a kernel of its own reads the marked misses' packed rows over PCIe into device
staging, where the copy engine puts them on the host path.  Both paths serve from one cache a
layer, sized the same way from ``hot_cache_bytes`` (layer_caches.py).

Sizes: ``budget_bytes`` of HBM; with a list, up to half for the fixed part (8 bytes of key and
``row_bytes`` a row), the rest for the recency part (16 bytes of key and stamp a slot), in a power
of two of sets.  ``disarm()`` (close, refresh) sets the device word that makes graphs captured
with this cache treat every id as a miss, then frees the rows.
"""
from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import torch

from ...core.errors import EngramError

WAYS = 8
POSITION_BITS = 26  # a call's ids, in the kernels' claims; the call's sequence number has the 37 bits above
MAX_CALL_IDS = (1 << POSITION_BITS) - 1
SKIP_ID = -1  # a hit, for the C gather (engine/gather.h's SKIP_ID)
OUTSIDE_ID = -2  # a miss outside the rows: classify writes it, the fetch zeroes the row and counts it
FIXED_SHARE = 0.5
LOAD_CHUNK_ROWS = 1 << 16  # rows of the fixed part gathered and copied at a time (17 MiB of 264-byte rows)


def on_device(device: torch.device):
    """``device`` made current where it is a GPU; nothing on the CPU (Triton's interpreter)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


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
        self.row_lo, self.row_hi = row_lo, row_hi  # the rows its kernels are compiled for (kernels.py)
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
        with on_device(device):
            self.fixed_keys = torch.from_numpy(fixed_keys if len(fixed_keys) else np.zeros(1, np.int64)).to(device)
            self.fixed_rows = torch.zeros((max(1, self.fixed_count), row_bytes), dtype=torch.uint8, device=device)
            self.recent_keys = torch.full((slots,), -1, dtype=torch.int64, device=device)
            self.recent_stamps = torch.zeros(slots, dtype=torch.int64, device=device)
            self.recent_rows = torch.zeros((slots, row_bytes), dtype=torch.uint8, device=device)
            self.claims = torch.zeros(self.sets, dtype=torch.int64, device=device)
            # [committed sequence number, this call's, armed, spare]: kept alive by captured graphs.
            self.control = torch.tensor([0, 0, 1, 0], dtype=torch.int64, device=device)
        self.load_seconds = 0.0
        # One call's kernels, classify to move, enqueue together: another call's classify between them
        # would take the same sequence number.  The host path holds its own lock (host_lookup.py).
        self.enqueue_lock = threading.Lock()

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
        """Fetch the fixed part's rows from the host mapping, a chunk at a time through pinned memory,
        and wait for them (attach time, not a lookup's): with the client's gather pool on the host
        path, with torch's own gather where there is no pool (the UVA path).  ``stream`` None: a CPU
        device (Triton's interpreter), plain copies."""
        if not self.fixed_count:
            return
        started = time.monotonic()
        chunk = min(LOAD_CHUNK_ROWS, self.fixed_count)
        pinned = stream is not None
        buffers = [torch.empty((chunk, self.row_bytes), dtype=torch.uint8, pin_memory=pinned) for _ in range(2)]
        done = [None, None]
        keys = self._fixed_keys_host  # within [row_lo, row_hi) (__init__)
        with torch.cuda.stream(stream):
            for index, start in enumerate(range(0, self.fixed_count, chunk)):
                ids = np.ascontiguousarray(keys[start:start + chunk])
                rows, event = buffers[index % 2], done[index % 2]
                if event is not None:
                    event.synchronize()  # that buffer's last copy has left it
                if pool is not None:
                    bad = pool.gather(host_rows.data_ptr(), row_lo, row_hi, self.row_bytes, ids.ctypes.data, True,
                                      len(ids), rows.data_ptr(), 0)
                    if bad:
                        raise EngramError(f"{bad} rows of the frequency list are outside rows [{row_lo}, {row_hi})")
                else:
                    torch.index_select(host_rows.view(-1, self.row_bytes), 0, torch.from_numpy(ids - row_lo),
                                       out=rows[:len(ids)])
                self.fixed_rows[start:start + len(ids)].copy_(rows[:len(ids)], non_blocking=pinned)
                if pinned:
                    done[index % 2] = torch.cuda.Event()
                    done[index % 2].record(stream)
        if pinned:
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
        if stream is not None:
            stream.synchronize()
        # The kernels read nothing else while disarmed (their loads are masked by the flag).
        self.fixed_rows = self.recent_rows = self.fixed_keys = self.recent_keys = None
        self.recent_stamps = self.claims = None

    def describe(self) -> dict:
        return {"bytes": self.nbytes if self.armed else 0, "fixed_rows": self.fixed_count if self.armed else 0,
                "recent_rows": self.recent_capacity if self.armed else 0, "load_seconds": round(self.load_seconds, 4)}

