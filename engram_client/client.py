"""EngramClient: what a DP rank imports to share the node's table through engramd.

    with EngramClient(endpoint=None, device="cuda:0", timeout=60.0) as client:
        out = client.table(1).lookup(ids)

Construction connects, waits (bounded) until the daemon's table is ready, attaches,
maps the table read-only, and on CUDA registers it (whole layers, or only the rows
given in ``row_ranges``) and verifies that the GPU reads the same bytes as the
host.  A heartbeat thread keeps the lease, re-attaches after a daemon restart, and
notices when the daemon serves a newer generation: ``refresh()`` moves to it at a
point the caller chooses (or, with ``auto_refresh=True``, before the next lookup).  ``close()``, leaving the ``with``
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
from .errors import (CudaRegistrationError, DaemonUnavailableError, EngramError, EngramTimeoutError,
                     NotAttachedError, NotReadyError, UnknownClientError)
from .fork_guard import release_in_forked_child
from .hot_rows import HotRowCache
from .generation_map import MappedGeneration
from .table import EngramTable

log = logging.getLogger("engram_client")
STATUS_POLL_S = 0.1


def default_max_programs(device: torch.device) -> int:
    """A quarter of the SMs: measured on an H200, a 393,216-row lookup then runs within 10% of an
    uncapped grid, while a matmul loop beside it slows 28% instead of 120% (fewer programs slow
    the lookups and barely help the loop: docs/BENCHMARKS.md)."""
    return max(1, torch.cuda.get_device_properties(device).multi_processor_count // 4)


class _Attachment:
    """Everything a client holds, apart from the client object, so a finalizer can release it."""

    def __init__(self, connection: DaemonConnection):
        self.connection = connection
        self.mapped: MappedGeneration | None = None
        self.tables: dict[int, EngramTable] = {}
        self.stream = None
        self.stop = threading.Event()
        self.heartbeat_thread: threading.Thread | None = None
        self.boot_id: str | None = None
        self.lease_lost = False
        self.refresh_pending = False  # the daemon serves another generation than the one mapped
        self.attach_args: dict[str, Any] = {}
        self.lock = threading.RLock()  # refresh vs heartbeat re-attach
        self.owner_pid = os.getpid()  # a forked child releases differently (fork_guard)

    @property
    def client_id(self) -> str | None:
        return self.mapped.lease_id if self.mapped is not None else None

    def heartbeat_loop(self, interval: float) -> None:
        while not self.stop.wait(interval):
            try:
                reply = self.connection.request("heartbeat", self.lease_args(), timeout=interval)
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
                elif self.mapped is not None and reply.get("generation") != self.mapped.generation:
                    self.refresh_pending = True

    def _reattach(self) -> None:
        """The daemon does not know our lease (it expired, or a new daemon runs): attach again.
        The new lease is on whatever the daemon serves now; if that is not the table we map,
        we keep serving from ours and flag a refresh."""
        with self.lock:
            try:
                reply = self.connection.request("attach", self.attach_args, timeout=2.0)
            except EngramError as exc:
                self.lease_lost = True
                log.warning("could not re-attach to engramd: %s", exc)
                return
            mapped = self.mapped
            self.boot_id, self.lease_lost = reply["boot_id"], False
            if mapped is None:
                return
            mapped.lease_id, mapped.lease_secret = reply["client_id"], reply.get("lease_secret", "")
            if (reply["table_path"], reply["fingerprint"]) != (mapped.path, mapped.fingerprint) or \
                    not _same_file(reply["table_path"], mapped):
                self.refresh_pending = True
            else:
                mapped.generation = reply["generation"]
            log.info("re-attached to engramd (boot %s) as %s%s", reply["boot_id"], mapped.lease_id,
                     "; a refresh is pending" if self.refresh_pending else "")

    def lease_args(self) -> dict[str, str | None]:
        mapped = self.mapped
        return {"client_id": mapped.lease_id, "secret": mapped.lease_secret} if mapped is not None else \
            {"client_id": None}

    def detach_quietly(self, lease_id: str, secret: str) -> None:
        """Release a lease; if the daemon is gone or already dropped it, it expires by itself."""
        try:
            self.connection.request("detach", {"client_id": lease_id, "secret": secret}, timeout=1.0)
        except EngramError:
            pass

    def release(self) -> None:
        if release_in_forked_child(self):
            return
        self.stop.set()
        if self.heartbeat_thread is not None and self.heartbeat_thread is not threading.current_thread():
            self.heartbeat_thread.join(timeout=5.0)
        with self.lock:
            if self.mapped is not None:
                self.detach_quietly(self.mapped.lease_id, self.mapped.lease_secret)
                if self.stream is not None:
                    self.stream.synchronize()
                for table in self.tables.values():  # handles the caller still holds must not read unmapped pages
                    table._retire("the client this table belongs to is closed; make a new EngramClient")
                self.tables.clear()
                self.mapped.release()
                self.mapped = None
            self.connection.close()


def _same_file(path: str, mapped: MappedGeneration) -> bool:
    """Whether ``path`` is still the file we mapped (a restarted daemon may reuse the name)."""
    if mapped.mapping is None:
        return False
    try:
        return os.stat(path).st_ino == mapped.mapping.inode
    except OSError:
        return False


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
                 lookup_max_programs: int | None = None, hot_cache_bytes: int = 0, hot_cache_refresh_every: int = 16,
                 auto_refresh: bool = False, lookup_timeout: float = 60.0):
        self.device = torch.device(device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda[:N], got {device}")
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise CudaRegistrationError(f"device {device} requested but CUDA is not available")
            self.device = torch.device("cuda", self.device.index if self.device.index is not None
                                       else torch.cuda.current_device())
        self.endpoint = endpoint
        self.auto_refresh = auto_refresh
        self._state = _Attachment(DaemonConnection(endpoint))
        self._finalizer = weakref.finalize(self, self._state.release)
        try:
            if hot_cache_bytes < 0 or (hot_cache_bytes and self.device.type != "cuda"):
                raise ValueError(f"hot_cache_bytes={hot_cache_bytes}: the hot-row cache lives in GPU memory and "
                                 "needs a CUDA device and a non-negative budget")
            if lookup_max_programs is None and self.device.type == "cuda":
                lookup_max_programs = default_max_programs(self.device)
            self._table_options = dict(out_dtype=out_dtype, wait_timeout=lookup_timeout, strategy=lookup_strategy,
                                       max_programs=lookup_max_programs or None)
            self._hot_cache = (hot_cache_bytes, hot_cache_refresh_every)
            self._row_ranges = row_ranges or {}
            self._attach(timeout, rank, heartbeat)
        except BaseException:
            self._finalizer()
            raise

    def _attach(self, timeout, rank, heartbeat) -> None:
        state = self._state
        _wait_until_ready(state.connection, timeout)
        state.attach_args = {"pid": os.getpid(), "host": socket.gethostname(), "rank": rank,
                             "device": str(self.device)}
        reply = state.connection.request("attach", state.attach_args, timeout=min(timeout, 10.0))
        state.boot_id = reply["boot_id"]
        try:
            state.mapped = MappedGeneration.open(reply, self.device, self._row_ranges)
        except BaseException:
            self._state.detach_quietly(reply["client_id"], reply.get("lease_secret", ""))
            raise
        state.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        for layer, lv in state.mapped.layers.items():
            state.tables[layer] = self._new_table(lv, len(state.mapped.layers))
        if heartbeat:
            interval = max(0.2, reply["lease_seconds"] / 3)
            state.heartbeat_thread = threading.Thread(target=state.heartbeat_loop, args=(interval,),
                                                      name="engram-client-heartbeat", daemon=True)
            state.heartbeat_thread.start()

    def _new_table(self, lv, layer_count: int) -> EngramTable:
        """A table with every lookup option this client was given, for one layer's view."""
        budget, refresh_every = self._hot_cache
        cache = HotRowCache.for_budget(budget // layer_count, lv.layout.head_dim, self._table_options["out_dtype"],
                                       self.device, refresh_every=refresh_every) if budget else None
        return EngramTable(lv.layout, lv.view, lv.lo, lv.hi, self.device, self._state.stream, hot_cache=cache,
                           before_call=self._before_call_hook(), **self._table_options)

    def _before_call_hook(self):
        """A hook for the tables that does not keep the client alive: a table reachable from
        the finalizer's state must not hold the client, or it would never be collected."""
        client_ref = weakref.ref(self)

        def before_call() -> None:
            client = client_ref()
            if client is not None and client.auto_refresh and client._state.refresh_pending:
                client.refresh()
        return before_call

    def refresh(self) -> bool:
        """Move to the generation the daemon serves now, if it is not the one mapped.

        Maps (and registers) the new table first; only then waits for this client's
        in-flight lookups, swaps every table to the new rows, and releases the old
        generation and its lease.  On any failure the old generation keeps serving.
        Returns whether the client moved."""
        state = self._state
        with state.lock:
            old = state.mapped
            if old is None:
                raise NotAttachedError("client is closed")
            status = state.connection.request("status", timeout=5.0)
            if status["state"] != "ready" or (status["generation"], status["fingerprint"], status["table_path"]) == \
                    (old.generation, old.fingerprint, old.path) and _same_file(old.path, old):
                state.refresh_pending = False
                return False
            reply = state.connection.request("attach", state.attach_args, timeout=10.0)
            try:
                new = MappedGeneration.open(reply, self.device, self._row_ranges)
            except BaseException:
                self._state.detach_quietly(reply["client_id"], reply.get("lease_secret", ""))
                raise
            if state.stream is not None:
                state.stream.synchronize()  # no kernel may still read the old pages
            for layer in list(state.tables):
                if layer not in new.layers:
                    state.tables.pop(layer)._retire(f"layer {layer} is not in generation {new.generation}")
            for layer, lv in new.layers.items():
                if layer in state.tables:
                    state.tables[layer]._swap(lv.layout, lv.view, lv.lo, lv.hi)
                else:
                    state.tables[layer] = self._new_table(lv, len(new.layers))
            state.mapped, state.boot_id, state.refresh_pending = new, reply["boot_id"], False
            self._state.detach_quietly(old.lease_id, old.lease_secret)
            old.release()
            log.info("moved from generation %d to %d (%s)", old.generation, new.generation, new.path)
            return True

    @property
    def generation(self) -> int | None:
        return self._state.mapped.generation if self._state.mapped is not None else None

    @property
    def table_path(self) -> str | None:
        return self._state.mapped.path if self._state.mapped is not None else None

    @property
    def layers(self) -> list[int]:
        return list(self._state.tables)

    @property
    def refresh_pending(self) -> bool:
        return self._state.refresh_pending

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
