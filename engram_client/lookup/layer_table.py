"""One layer's rows as the client holds them: exact lookups, synchronous or prefetched.

The client keeps one LayerTable per layer (refresh swaps its rows, close retires it); what
``client.table(layer)`` hands out is an EngramTable (table.py) over it, which also keeps the
client alive.

On CPU the client's gather pool copies the rows out of the read-only mapping and torch
dequantizes them.  On CUDA a call takes one of two paths (LookupConfig.path, chosen per call
under "auto"): the host path (host_lookup.py: CPU threads gather, the copy engine moves rows,
a small kernel dequantizes in HBM; capturable in CUDA graphs) or the UVA path (uva_lookup.py:
the Triton kernel reads rows over PCIe; capturable for decode-size calls where the client asks for
it by name, lookup_path or decode_path "uva").  Both serve from the layer's one HBM row cache where the
client has one (``hbm_cache``: lookup/cache/).  Either way an id outside the table (or outside the
registered row range) is never read: ids from the host raise IdsOutOfRangeError at once,
others zero their rows and are reported once their lookup has finished (out_of_range.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .dequant import dequantize_rows
from ..core.errors import EngramError, IdsOutOfRangeError, NotAttachedError, NotCapturableError
from ..core.layout import LayerLayout
from .host.host_lookup import HostPath, count_outside, stream_capturing
from .config import DECODE_ROWS, LookupConfig
from .out_of_range import OutOfRangeLedger
from .prefetch import PrefetchHandle
from .uva.graph_words import GraphWords
from .uva.uva_lookup import uva_prefetch, uva_words_prefetch


@dataclass
class LayerTable:
    layout: LayerLayout
    rows_view: torch.Tensor  # uint8 bytes of rows [row_lo, row_hi): the CPU mapping, or its CUDA UVA view
    row_lo: int
    row_hi: int
    device: torch.device
    stream: "torch.cuda.Stream | None" = None
    config: LookupConfig = field(default_factory=LookupConfig)
    host_rows: torch.Tensor | None = None  # the same bytes in the host mapping (default: rows_view on CPU)
    pool: object = None  # the client's GatherPool (host path and CPU lookups)
    hbm_cache: object = None  # the HBM row cache both paths serve from (cache/row_cache.py), or None
    before_call: Callable[[], None] | None = None  # the client's hook: an automatic refresh happens here
    retired: str | None = None  # why this table can no longer serve
    ledger: OutOfRangeLedger = field(init=False, repr=False)
    _host: HostPath | None = field(default=None, init=False, repr=False)
    _cache_kernels: object = field(default=None, init=False, repr=False)  # the UVA path's, built at its first call
    _zero_count: torch.Tensor | None = field(default=None, init=False, repr=False)
    graph_words: GraphWords | None = field(default=None, init=False, repr=False)  # UVA decode calls' (_takes_words)
    _description: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.config, LookupConfig):
            raise TypeError(f"config must be a LookupConfig, got {type(self.config).__name__}")
        if self.host_rows is None and self.rows_view.device.type == "cpu":
            self.host_rows = self.rows_view
        self.ledger = OutOfRangeLedger(self._describe)
        self._take_graph_words()
        if self.pool is not None and self.host_rows is not None:
            self._host = HostPath(self.pool, self.head_dim, self.layout.row_bytes, self.device, self.stream,
                                  self.config, self.hbm_cache)

    # Read-only views of the config, for callers that read a table's options.
    @property
    def out_dtype(self) -> torch.dtype:
        return self.config.out_dtype

    @property
    def strategy(self) -> str:
        return self.config.strategy

    @property
    def max_programs(self) -> int | None:
        return self.config.max_programs

    @property
    def wait_timeout(self) -> float:
        return self.config.wait_timeout

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
        """The rows as errors name them (cached: every prefetch hands it to its handle)."""
        if self._description is None:
            whole = (self.row_lo, self.row_hi) == (0, self.num_rows)
            self._description = f"layer {self.layer}'s rows [{self.row_lo}, {self.row_hi})" + \
                ("" if whole else " (registered range)")
        return self._description

    def _swap(self, layout: LayerLayout, rows_view: torch.Tensor, row_lo: int, row_hi: int,
              host_rows: torch.Tensor | None = None, hbm_cache=None) -> None:
        """Serve another generation's rows from now on (the client has drained the stream and released
        the old rows: graphs and the old HBM cache are disarmed); ``hbm_cache``: the new generation's."""
        same_rows = (layout.head_dim, layout.row_bytes) == (self.layout.head_dim, self.layout.row_bytes)
        self.layout, self.rows_view, self.row_lo, self.row_hi = layout, rows_view, row_lo, row_hi
        self._description = None
        self.host_rows = host_rows if host_rows is not None or rows_view.device.type != "cpu" else rows_view
        self.hbm_cache, self._cache_kernels = hbm_cache, None
        if self._host is not None and not same_rows:
            self._host = HostPath(self.pool, self.head_dim, layout.row_bytes, self.device, self.stream, self.config,
                                  hbm_cache)
        elif self._host is not None:
            self._host.cache = hbm_cache
        self._take_graph_words()  # the old generation's were released with its rows

    def _retire(self, reason: str) -> None:
        self.retired, self.rows_view, self.host_rows = reason, None, None
        self.release()

    def _take_graph_words(self) -> None:
        """Words for decode-size calls on the UVA path (captured ones, and the eager ones _takes_words
        gives them): taken now, since a capture can neither allocate memory it may free nor write a
        word before the graph runs."""
        if self.device.type == "cuda" and self.retired is None and self.config.captures_uva:
            self.graph_words = GraphWords(self.device)
            self.ledger.watch_total(self.graph_words.seen)

    def _takes_words(self, flat: torch.Tensor, capturing: bool) -> bool:
        """Whether a decode-size call on the kernel launches on the table's GraphWords: every captured
        one where the config captures on the kernel, and the eager ones with ids on this device (no
        count of their own to allocate, copy and watch), unless the HBM row cache or the dedup
        strategy asks for uva_prefetch's launch."""
        if capturing:
            return self.config.captures_uva
        return (self.graph_words is not None and flat.device == self.device and self.hbm_cache is None
                and self.config.strategy != "dedup")

    def release(self) -> None:
        """The rows are going away (close, refresh): graphs captured here must not read them again."""
        if self.graph_words is not None:
            self.graph_words.release()
            self.graph_words = None
        if self._host is not None:
            self._host.release()
        if self.hbm_cache is not None and self.stream is not None:
            self.hbm_cache.disarm(self.stream)  # done already where the host path holds it; its rows are freed
        self.ledger.drain()

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows [*ids.shape, head_dim] on the client's device; blocks until they are there."""
        return self.prefetch(ids).wait()

    def prefetch(self, ids: torch.Tensor) -> PrefetchHandle:
        """Start a lookup and return at once (on CUDA); ``wait()`` on the handle collects it."""
        if self.before_call is not None:
            self.before_call()
        if self.retired is not None:
            raise NotAttachedError(self.retired)
        if not isinstance(ids, torch.Tensor):
            raise TypeError(f"ids must be a torch.Tensor, got {type(ids).__name__}")
        if ids.dtype is not torch.int64 and ids.dtype is not torch.int32:
            raise TypeError(f"ids must be int32 or int64, got {ids.dtype}")
        self.ledger.raise_finished()
        shape = tuple(ids.shape)
        flat = ids.reshape(-1)
        n = flat.numel()
        if self.device.type == "cpu":
            return self._cpu_lookup(flat, shape)
        if n == 0:
            return PrefetchHandle(torch.empty((0, self.head_dim), dtype=self.config.out_dtype, device=self.device),
                                  shape, self._describe())
        caller = torch._C._cuda_getCurrentRawStream(self.device.index)
        capturing = stream_capturing(caller)
        path = self.config.choose_path(n)
        if path == "uva" and n <= DECODE_ROWS and self._takes_words(flat, capturing):
            return uva_words_prefetch(self, flat, shape)
        # A capture otherwise takes the host path: the UVA path's sort and eager counters cannot be captured.
        if capturing or path == "host":
            if self._host is None:
                raise NotCapturableError("lookups inside a CUDA graph capture need the host path, and this table "
                                         "has no gather pool") if capturing else \
                    EngramError("lookup_path 'host' needs the client's gather pool; this table has none")
            return self._host.prefetch(self, flat, shape, caller, capturing)  # checks host ids itself
        if flat.device.type == "cpu":
            flat = self._checked_host_ids(flat)
        return uva_prefetch(self, flat, shape)

    def _checked_host_ids(self, flat: torch.Tensor) -> torch.Tensor:
        """Ids from the host, contiguous, counted there (cheaply): a bad one raises at once."""
        flat = flat.contiguous()
        bad = count_outside(flat.data_ptr(), flat.dtype is torch.int64, flat.numel(), self.row_lo, self.row_hi)
        if bad:
            raise IdsOutOfRangeError(f"{bad} of {flat.numel()} ids are outside {self._describe()}; "
                                     "their rows were not read")
        return flat

    def _cpu_lookup(self, flat: torch.Tensor, shape: tuple[int, ...]) -> PrefetchHandle:
        if flat.device.type != "cpu":
            raise EngramError(f"ids are on {flat.device} but this client's device is cpu")
        flat = self._checked_host_ids(flat)
        if self._host is not None:
            rows = self._host.gather_rows(self, flat)
        else:
            rows = self.rows_view.view(-1, self.layout.row_bytes)[flat.to(torch.int64) - self.row_lo]
        out = dequantize_rows(rows, self.head_dim, self.config.out_dtype)
        return PrefetchHandle(out, shape, self._describe())

    def _unused_count(self) -> torch.Tensor:
        """The kernel's counter for ids already range-checked on the host: it stays zero (the
        kernel adds to it only for an out-of-range id), so one per table serves every call."""
        if self._zero_count is None:
            self._zero_count = torch.zeros(1, dtype=torch.int32, device=self.device)
        return self._zero_count

    def cache_kernels(self):
        """The HBM row cache's kernels for the UVA path (the host path compiles its own when it takes
        the cache): compiled at the first cached UVA call, which is never under a capture."""
        if self._cache_kernels is None or self._cache_kernels.cache is not self.hbm_cache:
            from .cache.kernels import CacheKernels

            self._cache_kernels = CacheKernels(self.hbm_cache, self.config.out_dtype, self.device)
        return self._cache_kernels
