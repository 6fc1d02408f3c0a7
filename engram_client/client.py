"""EngramClient: what a DP rank imports to share the node's table through engramd.

    with EngramClient(endpoint=None, device="cuda:0", timeout=60.0) as client:
        out = client.table(1).lookup(ids)

Construction connects, waits (bounded) until the daemon's table is ready, attaches, maps the
table read-only, and on CUDA registers it (whole layers, or only the rows given in ``row_ranges``)
and verifies that the GPU reads the same bytes as the host.  A heartbeat thread keeps the lease,
re-attaches after a daemon restart, and notices when the daemon serves a newer generation:
``refresh()`` moves to it at a point the caller chooses (or, with ``auto_refresh=True``, before
the next lookup).  ``close()``, leaving the ``with`` block, garbage collection and interpreter exit
all detach, unregister and unmap; none of them can hang, since every request they make is bounded.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import weakref
from dataclasses import replace
from typing import Any

import torch

from .client_state import ClientState, same_file
from .attach.connection import DaemonConnection
from .core.errors import CudaRegistrationError, NotAttachedError, UnknownLayerError
from .core.protocol import READY
from .lookup.cache.layer_caches import cache_for_view
from .lookup.config import LookupConfig, check_device_options, default_gather_threads, default_max_programs
from .attach.lease_keeper import LeaseKeeper, heartbeat_interval
from .attach.mapped_generation import MappedGeneration, describe_move
from .attach.readiness import refuse_missing_socket, wait_ready
from .lookup.layer_table import LayerTable
from .lookup.table import EngramTable
from .token_rows import hasher_for, prefetch_tokens

log = logging.getLogger("engram_client")


class EngramClient:
    def __init__(self, endpoint: str | None = None, device: str | torch.device = "cuda:0", timeout: float = 60.0,
                 row_ranges: dict[int, tuple[int, int]] | None = None, rank: int | None = None,
                 out_dtype: torch.dtype = torch.bfloat16, heartbeat: bool = True, lookup_strategy: str = "auto",
                 lookup_max_programs: int | None = None, hot_cache_bytes: int = 0, hot_cache_refresh_every: None = None,
                 auto_refresh: bool = False, lookup_timeout: float = 60.0, lookup_path: str = "auto",
                 strict_ids: bool = False, gather_threads: int | None = None, gather_budget: bool = True,
                 decode_path: str | None = None, decode_priority: str = "normal"):
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
        self._signalling = None  # how the host path signals on this device (host_signal.py), where it runs
        self._state = ClientState(DaemonConnection(endpoint))
        self._state.device = self.device
        self._requested_threads = gather_threads  # None: the node's gather budget (or this rank alone) decides
        self._use_budget = gather_budget  # False: this rank's pool ignores the node's budget (sized alone)
        self._finalizer = weakref.finalize(self, self._state.release)
        # The tables handed out, held weakly: each holds the client, so holding them here would make
        # a cycle that only the cyclic collector could end (the lease would outlive the last reference).
        self._handles: weakref.WeakValueDictionary[int, EngramTable] = weakref.WeakValueDictionary()
        try:
            if hot_cache_refresh_every is not None:  # the UVA path's old cache had it; one cache serves both now
                raise ValueError("hot_cache_refresh_every is gone: the HBM cache has no refresh (docs/hot-rows.md)")
            check_device_options(self.device, hot_cache_bytes, decode_path)
            if lookup_max_programs is None and self.device.type == "cuda":
                lookup_max_programs = default_max_programs(self.device)
            self.lookup_config = LookupConfig(
                out_dtype=out_dtype, path=lookup_path, strategy=lookup_strategy, max_programs=lookup_max_programs or None,
                wait_timeout=lookup_timeout, strict_ids=strict_ids,
                gather_threads=default_gather_threads(self.device) if gather_threads is None else gather_threads,
                hot_cache_bytes=hot_cache_bytes, decode_path=decode_path, decode_priority=decode_priority)
            self._row_ranges = row_ranges or {}
            self._attach(timeout, rank, heartbeat)
        except BaseException:
            self._finalizer()
            raise

    def _attach(self, timeout, rank, heartbeat) -> None:
        state = self._state
        refuse_missing_socket(state.connection.endpoint)  # as the command line says it, at once
        wait_ready(state.connection, timeout)
        from .lookup.host.gather_seat import rank_node
        state.numa_node = rank_node(self.device)  # picks the table replica it maps (protocol 1.4)
        state.attach_args = {"pid": os.getpid(), "host": socket.gethostname(), "rank": rank,
                             "device": str(self.device), "numa_node": state.numa_node}
        reply = state.connection.request("attach", state.attach_args, timeout=min(timeout, 10.0))
        state.boot_id = reply["boot_id"]
        with LeaseKeeper(state.connection, reply):  # mapping and registering may outlast the lease
            try:
                replica = state.replica(reply)
                state.mapped = MappedGeneration.open(reply, self.device, self._row_ranges,
                                                     state.connection.daemon_uid, replica)
            except BaseException:
                self._state.detach_quietly(reply["client_id"], reply.get("lease_secret", ""))
                raise
            if len(reply.get("replicas") or ()) > 1:
                log.info("engram_client: maps the replica of NUMA node %s (%s); this rank's node is %s",
                         replica["node"], replica["path"], "unknown" if state.numa_node is None else state.numa_node)
            state.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
            if self.device.type == "cpu" or self.lookup_config.takes_host_path:
                self._take_seat(reply.get("budget") if self._use_budget else None, timeout)
            for layer, lv in state.mapped.layers.items():
                state.tables[layer] = self._new_table(lv, state.mapped)
            state.hasher = hasher_for(state.mapped)
        if heartbeat:
            interval = heartbeat_interval(reply["lease_seconds"])
            state.heartbeat_thread = threading.Thread(target=state.heartbeat_loop, args=(interval,),
                                                      name="engram-client-heartbeat", daemon=True)
            state.heartbeat_thread.start()

    def _take_seat(self, budget: dict | None, timeout: float) -> None:
        """The host path's gather pool, on its seat on the node's budget (or sized alone)."""
        from .lookup.host.gather_seat import take_seat
        from .lookup.host.host_signal import STREAM_MEMOPS, signalling_for

        state = self._state
        if self.device.type == "cuda":
            self._signalling = signalling_for(self.device)
        state.seat = take_seat(budget, self.device, self._requested_threads, self.lookup_config.gather_threads,
                               timeout=min(timeout, 5.0))
        state.pool = state.seat.open_pool(self._signalling is not None and self._signalling.mode == STREAM_MEMOPS,
                                          realtime=self.lookup_config.decode_priority == "fifo")
        if state.seat.threads != self.lookup_config.gather_threads:
            self.lookup_config = replace(self.lookup_config, gather_threads=state.seat.threads)

    def _new_table(self, lv, mapped) -> LayerTable:
        """A table with this client's lookup config, for one layer's view (warmed on CUDA: the
        host path's first host function and kernel launch are slow, and belong to attach)."""
        config = self.lookup_config
        hbm = cache_for_view(config, lv, mapped, self.device, self._state.pool, self._state.stream)  # either path's
        table = LayerTable(lv.layout, lv.view, lv.lo, lv.hi, self.device, self._state.stream, config=config,
                            host_rows=lv.host_view, pool=self._state.pool, hbm_cache=hbm,
                            before_call=self._before_call_hook())
        if table._host is not None and self.device.type == "cuda":
            table._host.warm(table)
        return table

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
            if status["state"] != READY or (status["generation"], status["fingerprint"], state.replica(status)["path"]) \
                    == (old.generation, old.fingerprint, old.path) and same_file(old.path, old):
                state.refresh_pending = False
                return False
            reply = state.connection.request("attach", state.attach_args, timeout=10.0)
            with LeaseKeeper(state.connection, reply):  # until the new lease is the client's (heartbeat thread)
                try:
                    new = MappedGeneration.open(reply, self.device, self._row_ranges, state.connection.daemon_uid,
                                                state.replica(reply))
                    try:
                        new_hasher = hasher_for(new)
                    except BaseException:
                        new.release()
                        raise
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
                        state.tables[layer].release()  # graphs captured on the old rows must not read them
                        hbm = cache_for_view(self.lookup_config, lv, new, self.device, state.pool, state.stream)
                        state.tables[layer]._swap(lv.layout, lv.view, lv.lo, lv.hi, lv.host_view, hbm)
                    else:
                        state.tables[layer] = self._new_table(lv, new)
                state.mapped, state.boot_id, state.refresh_pending = new, reply["boot_id"], False
                state.hasher = new_hasher
            self._state.detach_quietly(old.lease_id, old.lease_secret)
            old.release()
            log.info("moved %s", describe_move(old, new))
            return True

    @property
    def generation(self) -> int | None:
        return self._state.mapped.generation if self._state.mapped is not None else None

    @property
    def table_path(self) -> str | None:
        return self._state.mapped.path if self._state.mapped is not None else None

    @property
    def replica(self) -> dict | None:
        """{"node", "path"} of the table replica this client maps (``node`` None: the one table,
        not bound to a node) and ``rank_node``, this rank's own NUMA node."""
        mapped = self._state.mapped
        return None if mapped is None else {"node": mapped.replica_node, "path": mapped.path,
                                            "rank_node": self._state.numa_node}

    @property
    def layers(self) -> list[int]:
        return list(self._state.tables)

    @property
    def refresh_pending(self) -> bool:
        return self._state.refresh_pending

    # -- public API ------------------------------------------------------------------------
    def table(self, layer: int) -> EngramTable:
        """The table of one Engram layer, by its layer id (an int, as in ``client.layers``).
        It keeps this client alive (EngramClient(...).table(1).lookup(ids) works); close() ends both."""
        tables = self._state.tables
        if not tables:
            raise NotAttachedError("client is closed")
        if isinstance(layer, bool) or not hasattr(layer, "__index__"):  # "1" would only look absent
            raise UnknownLayerError(f"layer ids are ints, got {type(layer).__name__} {layer!r}: "
                                    f"use one of {self.layers}")
        layer = layer.__index__()
        if (rows := tables.get(layer)) is None:
            raise UnknownLayerError(f"layer {layer} is not in this table (layers {self.layers})")
        handle = self._handles.get(layer)
        if handle is None or handle._rows is not rows:  # rows: a refresh may have dropped and re-added the layer
            handle = self._handles[layer] = EngramTable(rows, self)
        return handle

    @property
    def hasher(self):
        """Token ids -> row ids for this table (engram_client.hashing); where the table has no token
        map, an object whose every use raises HasherUnavailableError saying why."""
        return self._state.hasher

    def prefetch_tokens(self, token_ids: torch.Tensor, seq_starts=None, history: torch.Tensor | None = None):
        """Hash ``token_ids`` (packed sequences starting at ``seq_starts``) and start every layer's
        lookup; returns {layer: handle}, each handle's output [tokens, heads, head_dim]."""
        return prefetch_tokens(self._state.hasher, self._state.tables, token_ids, seq_starts, history)

    @property
    def lookup_path_info(self) -> dict[str, Any]:
        """How this client's lookups run: the lookup path asked for, the gather pool's threads, and
        on CUDA how the host path's stream and workers signal each other ("stream-memops", or
        "host-functions" where the device or driver lacks them) and why (host_signal.py)."""
        pool = self._state.pool
        info: dict[str, Any] = {"path": self.lookup_config.path, "decode_path": self.lookup_config.decode_path,
                                "device": str(self.device), "gather_threads": pool.threads if pool is not None else 0}
        if self._signalling is not None:
            return {**info, **self._signalling.as_dict()}
        return {**info, "signalling": None, "reason": "CPU lookups gather on the calling thread and the pool"
                if self.device.type == "cpu" else "lookup_path 'uva': no host path"}

    @property
    def gather_budget(self) -> str | None:
        """How this client's gather pool sits on the node's budget, in words (None: no host gathers)."""
        return self._state.seat.explanation if self._state.seat is not None else None

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
        return self._state.status(timeout)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> "EngramClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
