"""One layer's table as a rank sees it: exact lookups, synchronous or prefetched.

On CPU the rows are read from the read-only mapping and dequantized in torch.  On
CUDA they are read through UVA by the Triton kernel on the client's prefetch
stream.  Either way an id outside the table (or outside the registered row range)
is never read and raises IdsOutOfRangeError.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .dequant import dequantize_rows
from .core.errors import EngramError, IdsOutOfRangeError, NotAttachedError, NotCapturableError
from .core.layout import LayerLayout
from .hot_rows import HotRowCache
from .prefetch import PrefetchHandle

STRATEGIES = ("auto", "dedup", "direct")
# Measured on an H200 with a 64 GiB table (docs/BENCHMARKS.md): direct wins at 49,152 ids,
# dedup at 393,216, for uniform and Zipf ids alike.
DEDUP_MIN_ROWS = 131072


@dataclass
class EngramTable:
    layout: LayerLayout
    rows_view: torch.Tensor  # uint8 bytes of rows [row_lo, row_hi), CPU mapping or CUDA UVA view
    row_lo: int
    row_hi: int
    device: torch.device
    stream: "torch.cuda.Stream | None" = None
    out_dtype: torch.dtype = torch.bfloat16
    wait_timeout: float = 60.0
    # "dedup": sort the ids, fetch each distinct row once in address order (neighbouring
    # fetches share page-table walks; a row many ids want crosses PCIe once), copy repeats
    # within GPU memory; "direct": fetch every id as given.  See docs/BENCHMARKS.md.
    # "auto" picks dedup from DEDUP_MIN_ROWS ids up, where sorting pays for itself.
    strategy: str = "auto"
    # Cap on the lookup kernels' programs: a bounded grid leaves most SMs to the model's
    # kernels while a prefetch runs beside them.  None: one program per block of ids.
    max_programs: int | None = None
    # Ids per block and warps per program of the lookup kernels (benchmarks/lookup_grid.py):
    # measured at 16 and 4; 32 and 64 ids per block failed to compile with Triton 3.6.
    block_rows: int = 16
    num_warps: int = 4
    hot_cache: HotRowCache | None = None
    before_call: Callable[[], None] | None = None  # the client's hook: an automatic refresh happens here
    retired: str | None = None  # why this table can no longer serve
    _zero_count: torch.Tensor | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"lookup strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        if self.max_programs is not None and self.max_programs < 1:
            raise ValueError(f"max_programs must be positive or None, got {self.max_programs}")
        for name in ("block_rows", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two, got {value}")

    @property
    def layer(self) -> int:
        return self.layout.layer

    @property
    def num_rows(self) -> int:
        return self.layout.rows

    @property
    def head_dim(self) -> int:
        return self.layout.head_dim

    @property
    def head_sizes(self) -> tuple[int, ...]:
        return self.layout.head_sizes

    @property
    def head_offsets(self) -> tuple[int, ...]:
        return self.layout.head_offsets

    @property
    def row_range(self) -> tuple[int, int]:
        return self.row_lo, self.row_hi

    def _describe(self) -> str:
        whole = (self.row_lo, self.row_hi) == (0, self.num_rows)
        return f"layer {self.layer}'s rows [{self.row_lo}, {self.row_hi})" + ("" if whole else " (registered range)")

    def _check_ids(self, ids: torch.Tensor) -> None:
        if not isinstance(ids, torch.Tensor):
            raise TypeError(f"ids must be a torch.Tensor, got {type(ids).__name__}")
        if ids.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"ids must be int32 or int64, got {ids.dtype}")

    def _count_out_of_range(self, ids: torch.Tensor) -> int:
        return int(((ids < self.row_lo) | (ids >= self.row_hi)).sum())

    def _swap(self, layout: LayerLayout, rows_view: torch.Tensor, row_lo: int, row_hi: int) -> None:
        """Serve another generation's rows from now on (the client has drained the stream)."""
        self.layout, self.rows_view, self.row_lo, self.row_hi = layout, rows_view, row_lo, row_hi
        if self.hot_cache is not None:
            self.hot_cache.clear()  # cached rows are the old generation's

    def _retire(self, reason: str) -> None:
        self.retired, self.rows_view = reason, None

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """bf16 rows [*ids.shape, head_dim] on the client's device; blocks until they are there."""
        return self.prefetch(ids).wait()

    def prefetch(self, ids: torch.Tensor) -> PrefetchHandle:
        """Start a lookup and return at once (on CUDA); ``wait()`` on the handle collects it."""
        if self.before_call is not None:
            self.before_call()
        if self.retired is not None:
            raise NotAttachedError(self.retired)
        self._check_ids(ids)
        shape = tuple(ids.shape)
        flat = ids.reshape(-1)
        if flat.device.type == "cpu":
            bad = self._count_out_of_range(flat)  # cheap here, and the caller hears of it at once
            if bad:
                raise IdsOutOfRangeError(f"{bad} of {flat.numel()} ids are outside {self._describe()}; "
                                         "their rows were not read")
        if self.device.type == "cpu":
            return self._cpu_lookup(flat, shape)
        return self._cuda_prefetch(flat, shape)

    def _cpu_lookup(self, flat: torch.Tensor, shape: tuple[int, ...]) -> PrefetchHandle:
        if flat.device.type != "cpu":
            raise EngramError(f"ids are on {flat.device} but this client's device is cpu")
        rows = self.rows_view.view(-1, self.layout.row_bytes)[flat.to(torch.int64) - self.row_lo]
        out = dequantize_rows(rows, self.head_dim, self.out_dtype)
        return PrefetchHandle(out, shape, self._describe())

    def _cuda_prefetch(self, flat: torch.Tensor, shape: tuple[int, ...]) -> PrefetchHandle:
        from .kernels.lookup import launch_lookup, launch_lookup_dedup

        if torch.cuda.is_current_stream_capturing():
            # Capture would fail deep inside torch (a host sync, a side stream's allocations),
            # or record a lookup of whatever ids the capture saw.  Say so where the mistake is.
            raise NotCapturableError("an Engram lookup cannot be captured in a CUDA graph: call prefetch() and "
                                     "wait() outside the captured region and feed the output in as a static "
                                     "input (docs/integration.md, 'CUDA graphs')")
        caller = torch.cuda.current_stream(self.device)
        # prefetch() has counted ids that came from the host: none is out of range, so the kernel's
        # count needs no copy back and wait() no host sync.  Ids on the GPU are counted by the kernel.
        host_checked = flat.device.type == "cpu"
        if host_checked:
            # Through pinned memory, so that the copy is a plain asynchronous DMA: from pageable
            # memory the driver stages it, on the host's time.  torch's host allocator keeps the
            # pinned block until the copy has run.
            staged = flat if flat.is_pinned() else flat.contiguous().pin_memory()
            flat = staged.to(self.device, non_blocking=True)
        elif flat.device != self.device:
            flat = flat.to(self.device, non_blocking=True)  # ids on another GPU: the kernel counts them here
        flat = flat.contiguous()
        # Allocated on the caller's stream, so the memory belongs to the consumer of the result.
        out = torch.empty((flat.numel(), self.head_dim), dtype=self.out_dtype, device=self.device)
        bad_host = None if host_checked else torch.zeros(1, dtype=torch.int32, pin_memory=True)
        self.stream.wait_stream(caller)  # the ids may still be being written on the caller's stream
        with torch.cuda.stream(self.stream):
            bad_count = self._unused_count() if host_checked else torch.zeros(1, dtype=torch.int32,
                                                                              device=self.device)
            refresh_due = self.hot_cache is not None and self.hot_cache.observe(flat)
            dedup = self.strategy == "dedup" or (self.strategy == "auto" and flat.numel() >= DEDUP_MIN_ROWS)
            launch = launch_lookup_dedup if dedup else launch_lookup
            launch(self.rows_view, flat, out, bad_count, self.row_lo, self.row_hi, self.head_dim,
                   self.layout.row_bytes, block_rows=self.block_rows, max_programs=self.max_programs,
                   cache=self.hot_cache, num_warps=self.num_warps)
            if bad_host is not None:
                bad_host.copy_(bad_count, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
            if refresh_due:
                self.refresh_hot_rows()
        flat.record_stream(self.stream)
        out.record_stream(self.stream)
        return PrefetchHandle(out, shape, self._describe(), event=event, bad_host=bad_host,
                              keep_alive=(flat, bad_count), timeout=self.wait_timeout)

    def _unused_count(self) -> torch.Tensor:
        """The kernel's counter for ids already range-checked on the host: it stays zero (the
        kernel adds to it only for an out-of-range id), so one per table serves every call."""
        if self._zero_count is None:
            self._zero_count = torch.zeros(1, dtype=torch.int32, device=self.device)
        return self._zero_count

    def refresh_hot_rows(self) -> None:
        """Re-choose the cached rows from the ids seen lately (runs on the prefetch stream and
        waits for it once); lookups call this every ``refresh_every`` calls by themselves."""
        from .kernels.lookup import launch_lookup

        if self.hot_cache is None:
            return
        with torch.cuda.stream(self.stream):
            scratch = torch.zeros(1, dtype=torch.int32, device=self.device)
            self.hot_cache.refresh(
                lambda keys, rows: launch_lookup(self.rows_view, keys, rows, scratch, self.row_lo, self.row_hi,
                                                 self.head_dim, self.layout.row_bytes, block_rows=self.block_rows,
                                                 max_programs=self.max_programs, num_warps=self.num_warps),
                self.row_lo, self.row_hi)
