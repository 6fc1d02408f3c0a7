"""Filling a reserved table file from its source, in parallel, with progress.

A source fills rows [start, stop) of one layer into a packed per-thread buffer
([n, row_bytes], uint8) that the writer then puts in place.  Two sources exist: a checkpoint (pread of each tensor's
bytes into a per-thread buffer, then interleaved into the table) and the embedded
demo.  Memory stays bounded by threads x chunk size, whatever the table's size:
checkpoints are larger than RAM, so nothing is staged whole.

Owns the copy; the table file's naming and publication belong to shm_dir.
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from engram_client.core.demo_rows import demo_rows
from engram_client.core.errors import CheckpointError
from engram_client.core.layout import LayerLayout
from engram_client.core.table_file import TableHeader

from .checkpoint import CheckpointPlan
from ..guards.checkpoint_files import open_inside
from ..shm.table_files import TableWriter

CHUNK_BYTES = 32 * 1024 * 1024


@dataclass
class Progress:
    total_bytes: int = 0
    done_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # Told every byte count as it lands (the daemon's load_bytes counter), so a load's rate can be
    # scraped while it runs; it must be safe to call from the load threads.
    on_add: Callable[[int], None] = field(default=lambda n: None, repr=False)

    def add(self, n: int) -> None:
        with self._lock:
            self.done_bytes += n
        self.on_add(n)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"done_bytes": self.done_bytes, "total_bytes": self.total_bytes}


def interleave(dst: np.ndarray, weight: np.ndarray, scale: np.ndarray) -> None:
    """dst[:, :d] = weight; dst[:, d:] = scale, moving the widest words all three allow.

    Byte-wise, numpy copies the 8 scale bytes of each row in an inner loop of 8 and
    runs at ~0.4 GB/s; as one uint64 per row the same copy is several times faster."""
    word = next(w for w in (8, 4, 2, 1) if weight.shape[1] % w == 0 and scale.shape[1] % w == 0)
    dtype = np.dtype(f"u{word}")
    dst_words = dst.view(dtype)
    cut = weight.shape[1] // word
    dst_words[:, :cut] = weight.view(dtype)
    dst_words[:, cut:] = scale.view(dtype)


class CheckpointSource:
    def __init__(self, plan: CheckpointPlan):
        self.plan = plan
        self._fds: dict[str, int] = {}
        self._local = threading.local()
        self._layers = {layer.layout.layer: layer for layer in plan.layers}
        for path in plan.files:  # opened again as inspection did: a link swapped in since is refused
            try:
                self._fds[path] = open_inside(path, plan.root)
            except CheckpointError:
                self.close()
                raise

    def _buffer(self, nbytes: int) -> np.ndarray:
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.size < nbytes:
            buf = self._local.buf = np.empty(nbytes, dtype=np.uint8)
        return buf[:nbytes]

    def _pread(self, tensor, start_byte: int, out: np.ndarray) -> None:
        fd, want, got = self._fds[tensor.path], out.size, 0
        view = memoryview(out)
        while got < want:
            n = os.preadv(fd, [view[got:]], tensor.offset + start_byte + got)
            if n == 0:
                raise CheckpointError(f"{tensor.path}: tensor {tensor.name}: file ended while reading "
                                      f"(truncated after inspection?)")
            got += n

    def fill(self, layout: LayerLayout, start: int, stop: int, dst: np.ndarray) -> None:
        source, n = self._layers[layout.layer], stop - start
        buf = self._buffer(n * layout.row_bytes)
        weight = buf[:n * layout.head_dim]
        scale = buf[n * layout.head_dim:]
        self._pread(source.weight, start * layout.head_dim, weight)
        self._pread(source.scale, start * layout.scale_cols, scale)
        interleave(dst, weight.reshape(n, layout.head_dim), scale.reshape(n, layout.scale_cols))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class DemoSource:
    def __init__(self, seed: int):
        self.seed = seed

    def fill(self, layout: LayerLayout, start: int, stop: int, dst: np.ndarray) -> None:
        weight, scale = demo_rows(self.seed, layout.layer, np.arange(start, stop), layout.head_dim)
        interleave(dst, weight, scale)

    def close(self) -> None:
        pass


class RateLimit:
    """Spaces chunk starts so the load averages at most ``bytes_per_s`` (None: no limit).

    A load of hundreds of GiB next to running engines competes with them for memory
    bandwidth; operators can cap it."""

    def __init__(self, bytes_per_s: float | None):
        self.bytes_per_s = bytes_per_s
        self._next = time.monotonic()
        self._lock = threading.Lock()

    def take(self, nbytes: int, cancelled: threading.Event | None) -> None:
        if not self.bytes_per_s:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + nbytes / self.bytes_per_s
        if start > now and cancelled is not None:
            cancelled.wait(start - now)
        elif start > now:
            time.sleep(start - now)


def fill_table(writer: TableWriter, source, progress: Progress, threads: int,
               cancelled: threading.Event | None = None, max_rate: float | None = None) -> None:
    """Copy every layer's rows from ``source`` into ``writer``; raises the first error."""
    limit = RateLimit(max_rate)
    header: TableHeader = writer.header
    tasks = []
    for entry in header.layers:
        layout = entry.layout
        rows_per_chunk = max(1, CHUNK_BYTES // layout.row_bytes)
        for start in range(0, layout.rows, rows_per_chunk):
            tasks.append((entry, start, min(layout.rows, start + rows_per_chunk)))
    progress.total_bytes = sum(entry.nbytes for entry in header.layers)

    local = threading.local()

    def run(task) -> None:
        entry, start, stop = task
        if cancelled is not None and cancelled.is_set():
            return
        row_bytes = entry.layout.row_bytes
        nbytes = (stop - start) * row_bytes
        limit.take(nbytes, cancelled)
        if cancelled is not None and cancelled.is_set():
            return
        if getattr(local, "packed", None) is None or local.packed.size < nbytes:
            local.packed = np.empty(nbytes, dtype=np.uint8)
        packed = local.packed[:nbytes].reshape(stop - start, row_bytes)
        source.fill(entry.layout, start, stop, packed)
        writer.write(entry.offset + start * row_bytes, packed)
        progress.add(nbytes)

    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="engramd-load") as pool:
        futures = [pool.submit(run, task) for task in tasks]
        try:
            for future in futures:
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise
