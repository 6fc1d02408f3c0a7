"""The daemon's state: one table generation, its load, its clients, its lifecycle.

    loading ──▶ ready ──▶ stopping
       │                     ▲
       └──▶ failed ──────────┘

The load runs on its own thread; everything else runs on the server thread.  The
load thread only writes ``_progress`` and, at its end, hands over its outcome under
``_lock``.  A failed load leaves the daemon up and answering, with the reason in
``error`` and no table file left behind.

Owns the table file it creates; the socket belongs to server.py.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import Any, Callable

from engram_client.demo_rows import demo_config
from engram_client.errors import EngramError, NotReadyError, UnknownClientError
from engram_client.layout import build_layout
from engram_client.table_file import TableHeader

from . import __version__
from .checkpoint import read_checkpoint
from .config import ServeConfig
from .leases import LeaseTable
from .loader import CheckpointSource, DemoSource, Progress, fill_table
from .table_store import ShmDir, instance_id

log = logging.getLogger("engramd")
LOADING, READY, FAILED, STOPPING = "loading", "ready", "failed", "stopping"


class Daemon:
    def __init__(self, config: ServeConfig, on_state_change: Callable[[str], None] | None = None):
        self.config = config
        self.boot_id = uuid.uuid4().hex
        self.started_at = time.time()
        self.generation = 0
        self.state = LOADING
        self.error: str | None = None
        self.header: TableHeader | None = None
        self.table_path: str | None = None
        self.files: list[str] = []
        self.leases = LeaseTable(config.lease_seconds)
        self.stop_requested = threading.Event()
        self._cancel_load = threading.Event()
        self._progress = Progress()
        self._lock = threading.Lock()
        self._load_thread: threading.Thread | None = None
        self._on_state_change = on_state_change or (lambda state: None)
        self.shm = ShmDir(config.shm_dir, instance_id(config.endpoint))
        for path in self.shm.remove_orphans():
            log.warning("cleaned up %s, left behind by a daemon that died", path)

    # -- lifecycle -------------------------------------------------------------------
    def _set_state(self, state: str) -> None:
        with self._lock:
            self.state = state
        log.info("state -> %s (generation %d)", state, self.generation)
        self._on_state_change(state)

    def start_load(self) -> None:
        self.generation += 1
        self._load_thread = threading.Thread(target=self._load, name="engramd-load-main", daemon=True)
        self._load_thread.start()

    def _load(self) -> None:
        writer = source = None
        try:
            if self.config.checkpoint:
                plan = read_checkpoint(self.config.checkpoint)
                header = TableHeader.plan(plan.layouts, plan.fingerprint, plan.directory, self.generation)
                source, files = CheckpointSource(plan), list(plan.files)
            else:
                config = demo_config(self.config.demo_vocab_size)
                fingerprint = f"demo-v{self.config.demo_vocab_size}-s{self.config.demo_seed}"
                header = TableHeader.plan(build_layout(config), fingerprint, "<demo>", self.generation)
                source, files = DemoSource(self.config.demo_seed), []
            with self._lock:
                self.header, self.files = header, files
            self._progress.total_bytes = sum(entry.nbytes for entry in header.layers)
            writer = self.shm.create(header)
            log.info("loading %s into %s (%.2f GiB)", header.checkpoint, writer.partial_path, header.total_bytes / 2**30)
            started = time.monotonic()
            fill_table(writer, source, self._progress, self.config.load_threads, self._cancel_load,
                       self.config.max_load_rate)
            if self._cancel_load.is_set():
                raise EngramError("load cancelled by stop")
            path = writer.publish()
            writer = None
            elapsed = time.monotonic() - started
            log.info("table ready: %s, %.2f GiB in %.2f s (%.2f GB/s)", path, header.total_bytes / 2**30, elapsed,
                     self._progress.done_bytes / max(elapsed, 1e-9) / 1e9)
            with self._lock:
                self.table_path = path
            self._set_state(READY)
        except Exception as exc:  # any failure becomes state 'failed' with its reason
            message = str(exc) if isinstance(exc, EngramError) else f"{type(exc).__name__}: {exc}"
            with self._lock:
                self.error = message
            if not self._cancel_load.is_set():
                log.error("load failed: %s", message)
                self._set_state(FAILED)
        finally:
            if writer is not None:
                writer.abandon()
            if source is not None:
                source.close()

    def shutdown(self) -> None:
        """Enter 'stopping', cancel any load, unlink the table; mapped clients keep their pages."""
        if self.state != STOPPING:
            self._set_state(STOPPING)
        self._cancel_load.set()
        if self._load_thread is not None:
            self._load_thread.join(timeout=60.0)
            if self._load_thread.is_alive():
                log.error("load thread did not stop within 60 s; exiting anyway")
        if self.table_path is not None:
            try:
                os.unlink(self.table_path)
                log.info("unlinked %s", self.table_path)
            except FileNotFoundError:
                pass
        self.shm.close()

    # -- requests (server thread) -------------------------------------------------------
    def status(self) -> dict[str, Any]:
        with self._lock:
            header, state, error, files = self.header, self.state, self.error, list(self.files)
        return {
            "state": state, "generation": self.generation, "boot_id": self.boot_id, "version": __version__,
            "pid": os.getpid(), "started_at": self.started_at,
            "checkpoint": header.checkpoint if header else (self.config.checkpoint or "<demo>"),
            "fingerprint": header.fingerprint if header else None,
            "table_path": self.table_path if state == READY else None,
            "table_bytes": header.total_bytes if header else 0,
            "shm_dir": self.shm.directory, "files": files,
            "layers": [entry.layout.to_dict() for entry in header.layers] if header else [],
            "load": self._progress.snapshot(),
            "clients": self.leases.describe(), "lease_seconds": self.config.lease_seconds,
            "events_endpoint": self.config.events_endpoint,
            "error": error,
        }

    def attach(self, pid: int, host: str, rank: int | None, device: str) -> dict[str, Any]:
        if self.state != READY:
            raise NotReadyError(f"no table to attach to: state is {self.state}"
                                + (f" ({self.error})" if self.error else ""))
        lease = self.leases.grant(pid, host, rank, device, self.generation)
        log.info("client %s attached (pid %d on %s, device %s, rank %s)", lease.id, pid, host, device, rank)
        return {"client_id": lease.id, "lease_seconds": self.config.lease_seconds, "boot_id": self.boot_id,
                "generation": self.generation, "table_path": self.table_path,
                "fingerprint": self.header.fingerprint}

    def heartbeat(self, client_id: str) -> dict[str, Any]:
        if self.leases.renew(client_id) is None:
            raise UnknownClientError(f"no lease {client_id!r}: it expired or was granted by an earlier daemon; attach again")
        return {"boot_id": self.boot_id, "generation": self.generation, "lease_seconds": self.config.lease_seconds}

    def detach(self, client_id: str) -> dict[str, Any]:
        if not self.leases.release(client_id):
            raise UnknownClientError(f"no lease {client_id!r} to detach")
        log.info("client %s detached", client_id)
        return {"detached": client_id}

    def expire_leases(self) -> None:
        for lease in self.leases.expire():
            log.warning("lease of client %s (pid %d) expired after %.1f s without a heartbeat",
                        lease.id, lease.pid, self.config.lease_seconds)
