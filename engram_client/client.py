"""EngramClient: what a DP rank imports to share the node's table through engramd.

    with EngramClient(endpoint=None, device="cuda:0", timeout=60.0) as client:
        out = client.table(1).lookup(ids)

Construction connects, waits (bounded) until the daemon's table is ready, attaches,
maps the table read-only, and on CUDA registers it (whole layers, or only the rows
given in ``row_ranges``) and verifies that the GPU reads the same bytes as the
host.  A heartbeat thread keeps the lease.  ``close()``, leaving the ``with``
block, garbage collection and interpreter exit all detach, unregister and unmap;
none of them can hang, since every request they make is bounded.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from typing import Any

import torch

from .connection import DaemonConnection
from .errors import (DaemonUnavailableError, EngramError, EngramTimeoutError, NotAttachedError,
                     NotReadyError, TableFileError, UnknownClientError, CudaRegistrationError)
from .hot_rows import HotRowCache
from .mapping import ReadOnlyMapping
from .table import EngramTable
from .table_file import read_header

log = logging.getLogger("engram_client")
PAGE = os.sysconf("SC_PAGE_SIZE")
STATUS_POLL_S = 0.1


def default_max_programs(device: torch.device) -> int:
    """A quarter of the SMs: measured on an H200, a 393,216-row lookup then runs about as fast
    as with an uncapped grid, while a matmul loop beside it slows 2.2% instead of 88%."""
    return max(1, torch.cuda.get_device_properties(device).multi_processor_count // 4)


class _Attachment:
    """Everything a client holds, apart from the client object, so a finalizer can release it."""

    def __init__(self, connection: DaemonConnection):
        self.connection = connection
        self.client_id: str | None = None
        self.mapping: ReadOnlyMapping | None = None
        self.registrations: list = []
        self.tables: dict[int, EngramTable] = {}
        self.stop = threading.Event()
        self.heartbeat_thread: threading.Thread | None = None
        self.boot_id: str | None = None
        self.lease_lost = False
        self.attach_args: dict[str, Any] = {}

    def heartbeat_loop(self, interval: float) -> None:
        while not self.stop.wait(interval):
            try:
                reply = self.connection.request("heartbeat", {"client_id": self.client_id}, timeout=interval)
                self.lease_lost = False
            except UnknownClientError:
                self._reattach()
            except EngramError as exc:
                if not self.lease_lost:
                    log.warning("heartbeat to engramd failed: %s", exc)
                self.lease_lost = True
            else:
                if reply.get("boot_id") != self.boot_id:
                    self._reattach()

    def _reattach(self) -> None:
        """The daemon does not know us (lease expired, or a new daemon): attach again."""
        try:
            reply = self.connection.request("attach", self.attach_args, timeout=2.0)
        except EngramError as exc:
            self.lease_lost = True
            log.warning("could not re-attach to engramd: %s", exc)
            return
        self.client_id, self.boot_id, self.lease_lost = reply["client_id"], reply["boot_id"], False
        log.info("re-attached to engramd as %s", self.client_id)

    def release(self) -> None:
        self.stop.set()
        if self.heartbeat_thread is not None and self.heartbeat_thread is not threading.current_thread():
            self.heartbeat_thread.join(timeout=5.0)
        if self.client_id is not None:
            try:
                self.connection.request("detach", {"client_id": self.client_id}, timeout=1.0)
            except EngramError:
                pass  # the daemon is gone or already dropped us; the lease expires by itself
            self.client_id = None
        self.tables.clear()
        while self.registrations:
            self.registrations.pop().unregister()
        if self.mapping is not None:
            self.mapping.close()
            self.mapping = None
        self.connection.close()


def _wait_until_ready(connection: DaemonConnection, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last = None
    while True:
        remaining = deadline - time.monotonic()
        try:
            last = connection.request("status", timeout=max(0.1, min(2.0, remaining)))
        except DaemonUnavailableError:
            last = last if isinstance(last, dict) else None
        if last is not None:
            if last.get("state") == "ready":
                return last
            if last.get("state") == "failed":
                raise NotReadyError(f"engramd at {connection.endpoint} failed to load its table: {last.get('error')}")
        if time.monotonic() >= deadline:
            detail = "no answer" if last is None else f"state {last.get('state')}, loaded " \
                f"{last['load']['done_bytes']}/{last['load']['total_bytes']} bytes"
            raise EngramTimeoutError(f"waited {timeout:.1f} s for engramd at {connection.endpoint} "
                                     f"to have a ready table ({detail})")
        time.sleep(STATUS_POLL_S)


class EngramClient:
    def __init__(self, endpoint: str | None = None, device: str | torch.device = "cuda:0", timeout: float = 60.0,
                 row_ranges: dict[int, tuple[int, int]] | None = None, rank: int | None = None,
                 out_dtype: torch.dtype = torch.bfloat16, heartbeat: bool = True, lookup_strategy: str = "auto",
                 lookup_max_programs: int | None = None, hot_cache_bytes: int = 0, hot_cache_refresh_every: int = 16):
        self.device = torch.device(device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda[:N], got {device}")
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise CudaRegistrationError(f"device {device} requested but CUDA is not available")
            self.device = torch.device("cuda", self.device.index if self.device.index is not None
                                       else torch.cuda.current_device())
        self.endpoint = endpoint
        self._state = _Attachment(DaemonConnection(endpoint))
        self._finalizer = weakref.finalize(self, self._state.release)
        try:
            if hot_cache_bytes < 0 or (hot_cache_bytes and self.device.type != "cuda"):
                raise ValueError(f"hot_cache_bytes={hot_cache_bytes}: the hot-row cache lives in GPU memory and "
                                 "needs a CUDA device and a non-negative budget")
            if lookup_max_programs is None and self.device.type == "cuda":
                lookup_max_programs = default_max_programs(self.device)
            self._hot_cache = (hot_cache_bytes, hot_cache_refresh_every)
            self._attach(timeout, row_ranges or {}, rank, out_dtype, heartbeat,
                         dict(strategy=lookup_strategy, max_programs=lookup_max_programs or None))
        except BaseException:
            self._finalizer()
            raise

    def _attach(self, timeout, row_ranges, rank, out_dtype, heartbeat, lookup_options) -> None:
        state = self._state
        _wait_until_ready(state.connection, timeout)
        state.attach_args = {"pid": os.getpid(), "host": socket.gethostname(), "rank": rank,
                             "device": str(self.device)}
        reply = state.connection.request("attach", state.attach_args, timeout=min(timeout, 10.0))
        state.client_id, state.boot_id = reply["client_id"], reply["boot_id"]
        self.generation = reply["generation"]
        self.table_path = reply["table_path"]
        header, _ = read_header(self.table_path)
        if header.fingerprint != reply["fingerprint"]:
            raise TableFileError(f"{self.table_path}: fingerprint {header.fingerprint} is not the daemon's "
                                 f"{reply['fingerprint']}")
        unknown = set(row_ranges) - {entry.layout.layer for entry in header.layers}
        if unknown:
            raise ValueError(f"row_ranges names layers {sorted(unknown)} that the table does not have")
        state.mapping = ReadOnlyMapping(self.table_path, header.total_bytes)
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        for entry in header.layers:
            layout = entry.layout
            lo, hi = row_ranges.get(layout.layer, (0, layout.rows))
            if not (0 <= lo < hi <= layout.rows):
                raise ValueError(f"row_ranges[{layout.layer}] = ({lo}, {hi}) is not within [0, {layout.rows})")
            start, nbytes = entry.offset + lo * layout.row_bytes, (hi - lo) * layout.row_bytes
            view = state.mapping.tensor(start, nbytes)
            if self.device.type == "cuda":
                view = self._register(view, start, nbytes)
            budget, refresh_every = self._hot_cache
            cache = HotRowCache.for_budget(budget // len(header.layers), layout.head_dim, out_dtype, self.device,
                                           refresh_every=refresh_every) if budget else None
            state.tables[layout.layer] = EngramTable(layout, view, lo, hi, self.device, stream, out_dtype,
                                                     wait_timeout=timeout, hot_cache=cache, **lookup_options)
        self.layers = [entry.layout.layer for entry in header.layers]
        if heartbeat:
            interval = max(0.2, reply["lease_seconds"] / 3)
            state.heartbeat_thread = threading.Thread(target=state.heartbeat_loop, args=(interval,),
                                                      name="engram-client-heartbeat", daemon=True)
            state.heartbeat_thread.start()

    def _register(self, host_view: torch.Tensor, start: int, nbytes: int) -> torch.Tensor:
        """Register [start, start + nbytes) of the mapping (page-rounded) and return its GPU view."""
        from .cuda_host import HostRegistration

        state = self._state
        lo = start // PAGE * PAGE
        hi = -(-(start + nbytes) // PAGE) * PAGE
        registration = HostRegistration(state.mapping.address + lo, min(hi, state.mapping.nbytes) - lo, self.device)
        state.registrations.append(registration)
        view = registration.tensor()[start - lo:start - lo + nbytes]
        # Prove the GPU sees the table's bytes: compare the first and last 4 KiB with the host mapping.
        probe = min(4096, nbytes)
        for host_part, device_part in ((host_view[:probe], view[:probe]), (host_view[-probe:], view[-probe:])):
            if not torch.equal(device_part.cpu(), host_part):
                raise CudaRegistrationError(f"{self.table_path}: the GPU reads different bytes than the host "
                                            "at a registered range; refusing to serve from it")
        return view

    # -- public API ------------------------------------------------------------------------
    def table(self, layer: int) -> EngramTable:
        tables = self._state.tables
        if not tables:
            raise NotAttachedError("client is closed")
        if layer not in tables:
            raise KeyError(f"layer {layer} is not in this table (layers {self.layers})")
        return tables[layer]

    @property
    def client_id(self) -> str | None:
        return self._state.client_id

    @property
    def boot_id(self) -> str | None:
        return self._state.boot_id

    @property
    def attached(self) -> bool:
        return self._state.client_id is not None and not self._state.lease_lost

    def status(self, timeout: float = 5.0) -> dict[str, Any]:
        """The daemon's status (the same object ``engramd status --json`` prints)."""
        return self._state.connection.request("status", timeout=timeout)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> "EngramClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
