"""The host-gather path of one layer table: CPU threads gather, the copy engine moves, HBM dequantizes.

On CUDA one ``prefetch`` enqueues on the client's prefetch stream, in stream order, with one C
call (engram_client.lookup.host._host_gather): the ids' copy into pinned memory (ids on the GPU), the
signal that starts the gather on the client's pool into pinned staging, and per chunk a wait
for that chunk and its copy to device staging; then the staged-row dequant kernel and the
slot's event.  The signals are stream memory operations on a word in pinned memory where the
device has them, host functions otherwise (host_signal.py); ids already in host memory start
the gather at once.  No SM waits on PCIe, and the caller's thread never blocks.

Staging slots (pinned ids and rows, device rows, the lookup's CUDA events) are reused: a call
takes the first slot whose last run has finished on the CPU (a count the run's end lowers: no
CUDA query), growing it if the call is larger, or adds one, up to MAX_SLOTS; beyond that it
waits, bounded.  Device staging belongs to the prefetch stream, so reusing it is stream-ordered.

Under CUDA graph capture the same calls record graph nodes on a slot of its own, kept for the
client's life: every replay gathers the ids then in the captured input buffer.  On close such
slots are disarmed (a later replay zeroes its rows and reads nothing).

On ``device="cpu"`` the same pool gathers into a CPU buffer, GIL released, and torch dequantizes.
"""
from __future__ import annotations

import threading
import time

import torch

from . import _host_gather
from ...core.errors import EngramError, EngramTimeoutError, IdsOutOfRangeError, NotAttachedError, NotCapturableError
from ..prefetch import PrefetchHandle

_host_gather.set_error_classes(EngramError, NotAttachedError)
count_outside = _host_gather.count_outside
MAX_CHUNKS = _host_gather.MAX_CHUNKS
stream_capturing = _host_gather.stream_capturing
IDS_ON_HOST, IDS_ON_DEVICE, IDS_IN_PLACE = 0, 1, 2
CHUNK_BYTES = 4 << 20  # copies of this size run near the PCIe ceiling; smaller ones pipeline better
# Signalled slots: a decode-size call (6,144 ids) in two chunks, so the first one's copy runs
# while the second is gathered; a wait costs the stream microseconds, not a host function's ~35.
# More chunks pipeline a little more but cost the engine thread ~7 us each (two driver calls) and
# a graph replay ~5 us each (docs/history/benchmarks-2026-12.md, "Decode-size lookups").
DECODE_CHUNK_ROWS = 3072
MIN_SLOT_ROWS = 8192  # a decode-size call fits the first slot
MAX_SLOTS = 8
SLOT_POLL_S = 5e-5


def open_pool(threads: int, signalled: bool = False) -> "_host_gather.GatherPool":
    """The client's gather pool.  Where stream memory operations signal the workers (host_signal.py),
    no host function lends its thread to the gather: the pool starts ``threads`` workers
    (caller_gathers=False), and that is how its tables' slots know to be signalled."""
    return _host_gather.GatherPool(threads, caller_gathers=not signalled)


def chunk_count(n: int, row_bytes: int, signalled: bool) -> int:
    """Chunks of a call: >= 4 MiB each for large calls; signalled slots also split decode sizes."""
    by_bytes = n * row_bytes // CHUNK_BYTES
    return max(1, min(MAX_CHUNKS, max(by_bytes, n // DECODE_CHUNK_ROWS) if signalled else by_bytes))


class _Slot:
    __slots__ = ("job", "staging", "keep", "slotmap", "gather", "ids_dev", "ids_pinned")

    def __init__(self, pool, capacity: int, row_bytes: int, stream: torch.cuda.Stream, graph: bool, cached: bool):
        with torch.cuda.stream(stream):  # the prefetch stream owns it: reuse is stream-ordered
            # Created with the stream's device current: the job's CUDA events belong to its context.
            self.job = _host_gather.StagedJob(pool, capacity, row_bytes, graph, not pool.caller_gathers)
            self.staging = torch.empty(capacity * row_bytes, dtype=torch.uint8, device=stream.device)
        self.slotmap = self.gather = self.ids_dev = self.ids_pinned = None
        if cached:
            self.add_cache_buffers(capacity, stream, graph)
        self.keep = None  # a graph's host ids buffer, read at every replay (and its cache's control word)

    def add_cache_buffers(self, capacity: int, stream: torch.cuda.Stream, graph: bool) -> None:
        """The HBM cache's per-call buffers (lookup/cache/row_cache.py); also for a slot made before its table had a cache."""
        with torch.cuda.stream(stream):
            self.slotmap = torch.empty(capacity, dtype=torch.int32, device=stream.device)
            self.gather = torch.empty(capacity, dtype=torch.int64, device=stream.device)
            self.ids_dev = torch.empty(capacity, dtype=torch.int64, device=stream.device)
        self.ids_pinned = None if graph else torch.empty(capacity, dtype=torch.int64, device="cpu", pin_memory=True)


class HostPath:
    def __init__(self, pool, head_dim: int, row_bytes: int, device: torch.device, stream, config, cache=None):
        self.pool, self.head_dim, self.row_bytes, self.device = pool, head_dim, row_bytes, device
        self.stream, self.config = stream, config
        self.cache = cache  # an HbmRowCache (lookup/cache/row_cache.py), or None
        self._slots: list[_Slot] = []
        self._graph_slots: list[_Slot] = []
        self._lock = threading.Lock()  # two threads prefetching on one table must not take one slot
        self._dequant = None
        self.signalled = stream is not None and not pool.caller_gathers
        if stream is not None:
            from .dequant_kernel import StagedDequant

            self._raw_stream = stream.cuda_stream
            with torch.cuda.device(device):  # the kernel is loaded into the current device's context
                self._dequant = StagedDequant(head_dim, row_bytes, config.out_dtype, device)

    @property
    def cache(self):
        return self._cache

    @cache.setter
    def cache(self, cache) -> None:
        """Take ``cache`` (or None), its kernels compiled now: attach or refresh, never a capture."""
        kernels = None
        if cache is not None:
            from ..cache.kernels import CacheKernels

            kernels = CacheKernels(cache, self.config.out_dtype, self.device)
        self._cache, self._cache_kernels = cache, kernels

    # -- CPU ---------------------------------------------------------------------------------
    def gather_rows(self, table, flat: torch.Tensor) -> torch.Tensor:
        """Packed rows [n, row_bytes] of ``flat`` (range-checked by the caller) into CPU memory."""
        n = flat.numel()
        rows = torch.empty((n, self.row_bytes), dtype=torch.uint8)
        if n:
            self.pool.gather(table.host_rows.data_ptr(), table.row_lo, table.row_hi, self.row_bytes,
                             flat.data_ptr(), flat.dtype == torch.int64, n, rows.data_ptr(), table.ledger.address)
        return rows

    # -- CUDA --------------------------------------------------------------------------------
    def prefetch(self, table, flat: torch.Tensor, shape: tuple[int, ...], caller: int,
                 capturing: bool) -> PrefetchHandle:
        """Enqueue a lookup ordered after ``caller`` (the caller's raw CUDA stream).  Ids from the
        host are range-checked on the way into pinned memory: a bad one raises before anything is
        enqueued.  Host time matters here: only the output's allocation, two C calls and the
        dequant launch happen per call."""
        if torch._C._cuda_getDevice() != self.device.index:  # torch.cuda.current_device(), less its checks
            # A rank whose current device is another GPU: the driver calls, the slot's events and the
            # dequant kernel all belong to this client's device, so make it current for the call.
            with torch.cuda.device(self.device):
                return self._prefetch(table, flat, shape, caller, capturing)
        return self._prefetch(table, flat, shape, caller, capturing)

    def _prefetch(self, table, flat: torch.Tensor, shape: tuple[int, ...], caller: int,
                  capturing: bool) -> PrefetchHandle:
        n = flat.numel()
        ids_device = flat.device
        on_host = ids_device.type == "cpu"
        if not on_host and ids_device != self.device:
            flat = flat.to(self.device, non_blocking=True)  # ids on another GPU
        if not (capturing and on_host):  # a captured host buffer is read in place at every replay
            flat = flat.contiguous()
        out = torch.empty((n, self.head_dim), dtype=self.config.out_dtype, device=self.device)
        where = (IDS_IN_PLACE if capturing else IDS_ON_HOST) if on_host else IDS_ON_DEVICE
        with self._lock:
            if capturing:
                # The prefetch stream joins the capture first, so that the slot's device staging
                # comes from the graph's memory pool and lives as long as the graph.
                self.stream.wait_stream(torch.cuda.current_stream(self.device))
                slot = self._graph_slot(flat, n, on_host)
            else:
                slot = self._free_slot(n, table)
            if self._cache is not None:
                self._cached_enqueue(table, slot, flat, n, on_host, capturing, caller, out)
                return self._handle(table, slot, flat, out, shape, on_host)
            bad = slot.job.enqueue(caller, self._raw_stream, table.host_rows.data_ptr(), table.row_lo, table.row_hi,
                                   flat.data_ptr(), where, flat.dtype is torch.int64, n, slot.staging.data_ptr(),
                                   table.ledger.address, chunk_count(n, self.row_bytes, self.signalled))
            if bad:
                raise IdsOutOfRangeError(f"{bad} of {n} ids are outside {table._describe()}; "
                                         "their rows were not read")
            self._dequant(slot.staging, out, n, self.stream, self._raw_stream)
            slot.job.finish(self._raw_stream)
        return self._handle(table, slot, flat, out, shape, on_host)

    def _handle(self, table, slot: _Slot, flat: torch.Tensor, out: torch.Tensor, shape, on_host: bool):
        out.record_stream(self.stream)
        if not on_host:
            flat.record_stream(self.stream)
        return PrefetchHandle(out, shape, table._describe(), event=slot.job, ledger=table.ledger,
                              strict=self.config.strict_ids, timeout=self.config.wait_timeout)

    def _cached_enqueue(self, table, slot: _Slot, flat: torch.Tensor, n: int, on_host: bool, capturing: bool,
                        caller: int, out: torch.Tensor) -> None:
        """Classify on the GPU, gather only the misses, serve (lookup/cache/row_cache.py has the diagram).  Lock held."""
        cache, kernels, raw = self._cache, self._cache_kernels, self._raw_stream
        cache.check_call(n)
        if slot.slotmap is None:  # made before the table had a cache (a refresh added one); free, not a graph's
            slot.add_cache_buffers(slot.job.capacity, self.stream, graph=False)
        if on_host:
            if capturing and not flat.is_pinned():
                raise NotCapturableError("with the hot-row cache, ids from the host captured in a CUDA graph must be "
                                         "in pinned memory (torch.empty(..., pin_memory=True)): each replay copies "
                                         "them to the GPU, where the cache is looked up")
            if not capturing:
                bad = count_outside(flat.data_ptr(), flat.dtype is torch.int64, n, table.row_lo, table.row_hi)
                if bad:
                    raise IdsOutOfRangeError(f"{bad} of {n} ids are outside {table._describe()}; "
                                             "their rows were not read")
                slot.ids_pinned[:n].copy_(flat)  # the slot is free: its last copy from here has run
                flat = slot.ids_pinned[:n]
        if not capturing:  # (a capture has joined already) the kernels run after the caller's work so far
            slot.job.fork(caller, raw)
        ids = flat
        if on_host:
            with torch.cuda.stream(self.stream):
                slot.ids_dev[:n].copy_(flat, non_blocking=True)
            ids = slot.ids_dev
        kernels.classify(ids, n, table.row_lo, table.row_hi, slot.slotmap, slot.gather, self.stream, raw)
        # Ordered by the fork above (or the capture's join): the enqueue's own fork is skipped.
        slot.job.enqueue(raw, raw, table.host_rows.data_ptr(), table.row_lo, table.row_hi, slot.gather.data_ptr(),
                         IDS_ON_DEVICE, True, n, slot.staging.data_ptr(), table.ledger.address,
                         chunk_count(n, self.row_bytes, self.signalled), True)
        kernels.serve(slot.staging, out, n, slot.slotmap, slot.gather, self.stream, raw)
        slot.job.finish(raw)
        if capturing:
            slot.keep = (slot.keep, cache.control)

    def _free_slot(self, n: int, table) -> _Slot:
        deadline = None
        while True:
            for index, slot in enumerate(self._slots):
                if not slot.job.in_flight:
                    if slot.job.capacity < n:  # grown with headroom: call sizes vary a little
                        slot = self._slots[index] = self._new_slot(max(n, slot.job.capacity * 5 // 4), graph=False)
                    return slot
            if len(self._slots) < MAX_SLOTS:
                self._slots.append(self._new_slot(max(n, MIN_SLOT_ROWS), graph=False))
                return self._slots[-1]
            now = time.monotonic()
            deadline = deadline or now + self.config.wait_timeout
            if now > deadline:
                raise EngramTimeoutError(f"waited {self.config.wait_timeout:.1f} s for one of the {MAX_SLOTS} staging "
                                         f"slots of {table._describe()} to finish its lookup on the prefetch stream")
            time.sleep(SLOT_POLL_S)

    def _new_slot(self, capacity: int, graph: bool) -> _Slot:
        return _Slot(self.pool, capacity, self.row_bytes, self.stream, graph, self.cache is not None)

    def _graph_slot(self, flat: torch.Tensor, n: int, on_host: bool) -> _Slot:
        if on_host and not flat.is_contiguous():
            raise NotCapturableError("ids from the host captured in a CUDA graph must be one contiguous buffer: "
                                     "each replay gathers the ids then in that buffer")
        slot = self._new_slot(n, graph=True)
        slot.keep = flat
        self._graph_slots.append(slot)
        return slot

    def warm(self, table) -> None:
        """One lookup of one row, waited for: the first host function of a process costs ~0.3 ms."""
        caller = torch.cuda.current_stream(self.device).cuda_stream
        handle = self.prefetch(table, torch.tensor([table.row_lo], dtype=torch.int64), (1,), caller, capturing=False)
        handle.wait()
        self.stream.synchronize()

    def release(self) -> None:
        """The client is closing (its stream drained): graphs that replay later must not read the table."""
        for slot in self._graph_slots:
            slot.job.disarm()
        if self.cache is not None:
            self.cache.disarm(self.stream)
        self._slots.clear()
