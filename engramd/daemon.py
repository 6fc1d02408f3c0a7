"""The daemon's state: table generations, their loads, the clients, the lifecycle.

    loading ──▶ ready ──▶ stopping          (state of the served generation)
       │          │ ▲          ▲
       └▶ failed ─┼─┼──────────┘
                  ▼ │
           reload: g+1 loads beside g; on success g+1 is served and g retires,
                   on failure g goes on and status says why

A start first looks for a complete table its predecessor (same endpoint, same shm
dir) left behind: if its format, layout and checkpoint fingerprint match what it
would load, it is re-adopted at once instead of reloaded.  A retired generation's
file is unlinked once no lease holds it, or after ``retire_grace_seconds``; ranks that
still map it keep their pages either way.

Loads run on one load thread at a time; everything else runs on the server thread.
The load thread writes only its generation's progress and, at its end, hands over
its outcome under ``_lock``.  No table is visible before it is complete.

Owns the table files it creates; the socket belongs to server.py.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import Any, Callable

from engram_client.demo_rows import demo_config
from engram_client.errors import EngramError, NotReadyError, ProtocolError, TableFileError, UnknownClientError
from engram_client.layout import build_layout
from engram_client.table_file import TableHeader, read_header

from . import __version__
from .checkpoint import read_checkpoint
from .checkpoint_guard import CheckpointGuard
from .config import ServeConfig
from .generation import FAILED, READY, Generation
from .lease_limits import STATUS_CLIENTS
from .leases import LeaseTable
from .loader import CheckpointSource, DemoSource, fill_table
from .metrics import NoMetrics
from .numa import bind_this_thread
from .served_record import record_path, resume_checkpoint, write_record
from .table_store import ShmDir, instance_id

log = logging.getLogger("engramd")
STOPPING = "stopping"


class Daemon:
    def __init__(self, config: ServeConfig, on_state_change: Callable[[str], None] | None = None, metrics=None):
        self.config = config
        self.metrics = metrics or NoMetrics()
        self.boot_id = uuid.uuid4().hex
        self.started_at = time.time()
        self.leases = LeaseTable(config.lease_seconds)
        self.stop_requested = threading.Event()
        self.stopping = False
        self.current = Generation(0, config.checkpoint)  # replaced by start_load
        self.pending: Generation | None = None  # a reload's generation, while loading or after failing
        self.retiring: dict[int, Generation] = {}
        self._last_number = 0
        self._cancel_load = threading.Event()
        self._lock = threading.Lock()
        self._load_thread: threading.Thread | None = None
        self._on_state_change = on_state_change or (lambda state: None)
        self.shm = ShmDir(config.shm_dir, instance_id(config.endpoint), 0o640 if config.gid is not None else 0o600,
                          config.gid)
        self._served_record = record_path(self.shm.directory, self.shm.instance)
        for path in self.shm.remove_orphans():
            log.warning("cleaned up %s, left behind by a daemon that died", path)

    # -- derived views ---------------------------------------------------------------
    @property
    def state(self) -> str:
        return STOPPING if self.stopping else self.current.state

    @property
    def generation(self) -> int:
        return self.current.number

    @property
    def table_path(self) -> str | None:
        return self.current.path if self.current.state == READY else None

    # -- loading ---------------------------------------------------------------------
    def _announce(self) -> None:
        log.info("state -> %s (generation %d)", self.state, self.generation)
        self._on_state_change(self.state)

    def start_load(self) -> None:
        """The first load of this process: re-adopt a predecessor's table, or load afresh."""
        checkpoint = resume_checkpoint(self._served_record, self.config.checkpoint, self._allowed_checkpoint)
        self._begin(Generation(self._next_number(), checkpoint), first=True)

    def _next_number(self) -> int:
        self._last_number += 1
        return self._last_number

    def _begin(self, generation: Generation, first: bool = False) -> None:
        self._load_thread = threading.Thread(target=self._load, args=(generation, first),
                                             name=f"engramd-load-g{generation.number}", daemon=True)
        self._load_thread.start()

    def _plan(self, generation: Generation):
        if generation.checkpoint:
            plan = read_checkpoint(generation.checkpoint)
            header = TableHeader.plan(plan.layouts, plan.fingerprint, plan.directory, generation.number)
            return header, lambda: CheckpointSource(plan), list(plan.files)
        vocab, seed = self.config.demo_vocab_size, self.config.demo_seed
        header = TableHeader.plan(build_layout(demo_config(vocab)), f"demo-v{vocab}-s{seed}", "<demo>",
                                  generation.number)
        return header, lambda: DemoSource(seed), []

    def _adopt(self, generation: Generation, wanted: TableHeader) -> bool:
        """Take over our predecessor's complete table if it is exactly what we would load."""
        adopted = None
        for number, path in self.shm.own_tables():
            try:
                found, _ = read_header(path)
            except TableFileError as exc:
                log.warning("not re-adopting %s: %s", path, exc)
                found = None
            same = found is not None and found.fingerprint == wanted.fingerprint and \
                [e.layout for e in found.layers] == [e.layout for e in wanted.layers]
            if adopted is None and same:
                adopted = (number, path, found)
            else:
                self.shm.unlink(path)
                log.info("removed %s: a predecessor's table that is not the one to serve", path)
        if adopted is None:
            return False
        number, path, found = adopted
        generation.number, generation.path, generation.header, generation.adopted = number, path, found, True
        self._last_number = max(self._last_number, number)
        generation.progress.total_bytes = generation.progress.done_bytes = sum(e.nbytes for e in found.layers)
        self.metrics.readoptions.inc()
        log.info("re-adopted %s (generation %d) without reloading", path, number)
        return True

    def _load(self, generation: Generation, first: bool) -> None:
        if first:
            with self._lock:
                self.current = generation
        writer = source = None
        try:
            header, make_source, files = self._plan(generation)
            generation.files = files
            guard = CheckpointGuard(files)  # before the first row is read
            if first and self._adopt(generation, header):
                self._finish(generation)
                return
            generation.header = header
            generation.progress.total_bytes = sum(entry.nbytes for entry in header.layers)
            if self.config.numa_node is not None:
                bind_this_thread(self.config.numa_node)  # fallocate below places every page on that node
            source = make_source()
            writer = self.shm.create(header)
            log.info("loading generation %d from %s into %s (%.2f GiB)", generation.number, header.checkpoint,
                     writer.partial_path, header.total_bytes / 2**30)
            started = time.monotonic()
            fill_table(writer, source, generation.progress, self.config.load_threads, self._cancel_load,
                       self.config.max_load_rate)
            if self._cancel_load.is_set():
                raise EngramError("load cancelled by stop")
            guard.verify(source, header, writer.read)
            generation.path = writer.publish()
            writer = None
            elapsed = time.monotonic() - started
            log.info("generation %d ready: %s, %.2f GiB in %.2f s (%.2f GB/s)", generation.number, generation.path,
                     header.total_bytes / 2**30, elapsed, generation.progress.done_bytes / max(elapsed, 1e-9) / 1e9)
            self._finish(generation)
        except Exception as exc:  # any failure becomes that generation's 'failed', with its reason
            generation.error = str(exc) if isinstance(exc, EngramError) else f"{type(exc).__name__}: {exc}"
            generation.state = FAILED
            if not self._cancel_load.is_set():
                log.error("generation %d failed to load: %s", generation.number, generation.error)
                if generation is self.current:
                    self._announce()
        finally:
            if writer is not None:
                writer.abandon()
            if source is not None:
                source.close()

    def _finish(self, generation: Generation) -> None:
        """Serve a freshly complete generation; the one it replaces starts retiring."""
        with self._lock:
            generation.state = READY
            previous = self.current
            if generation is not previous:
                if previous.path is not None:
                    previous.retired_at = time.monotonic()
                    self.retiring[previous.number] = previous
                self.current, self.pending = generation, None
        write_record(self._served_record, self.config.checkpoint, generation.checkpoint)
        self._announce()

    def reload(self, checkpoint: str | None) -> dict[str, Any]:
        """Load generation g+1 beside the served one; it takes over once complete."""
        if self.stopping:
            raise NotReadyError("the daemon is stopping")
        if self._load_thread is not None and self._load_thread.is_alive():
            raise NotReadyError("a load is already in progress; wait for it (see status) before reloading")
        source = self._allowed_checkpoint(checkpoint) if checkpoint is not None else self.current.checkpoint
        generation = Generation(self._next_number(), source)
        with self._lock:
            if self.current.state == READY:
                self.pending = generation  # the served generation goes on meanwhile
            else:
                self.current, self.pending = generation, None  # nothing served: this becomes the load
        if generation is self.current:
            self._announce()
        log.info("reload: generation %d from %s", generation.number, source or "<demo>")
        self._begin(generation)
        return {"generation": generation.number, "checkpoint": source or "<demo>"}

    def _allowed_checkpoint(self, checkpoint: str) -> str:
        """Only directories under the configured reload roots may be read."""
        real = os.path.realpath(checkpoint)
        for root in self.config.reload_roots:
            root = os.path.realpath(root)
            if real == root or real.startswith(root.rstrip("/") + "/"):
                if not os.path.isdir(real):
                    raise ProtocolError(f"reload checkpoint {checkpoint}: no such directory")
                return real
        allowed = ", ".join(self.config.reload_roots) or "none configured (--reload-root)"
        raise ProtocolError(f"reload checkpoint {checkpoint} is outside the reload roots ({allowed})")

    # -- housekeeping (server thread) ------------------------------------------------------
    def housekeeping(self) -> None:
        for lease in self.leases.expire():
            self.metrics.lease_expiries.inc()
            log.warning("lease of client %s (pid %d) expired after %.1f s without a heartbeat",
                        lease.id, lease.pid, self.config.lease_seconds)
        now = time.monotonic()
        held = self.leases.generations_held()
        for number, generation in list(self.retiring.items()):
            grace_over = now - generation.retired_at > self.config.retire_grace_seconds
            if number not in held or grace_over:
                self.shm.unlink(generation.path)
                del self.retiring[number]
                log.info("removed generation %d's table %s (%s)", number, generation.path,
                         "grace period over" if number in held else "no client holds it")

    def shutdown(self) -> None:
        """Enter 'stopping', cancel any load, unlink our tables; mapped clients keep their pages."""
        if not self.stopping:
            self.stopping = True
            self._announce()
        self._cancel_load.set()
        if self._load_thread is not None:
            self._load_thread.join(timeout=60.0)
            if self._load_thread.is_alive():
                log.error("load thread did not stop within 60 s; exiting anyway")
        for generation in [self.current, *self.retiring.values()]:
            if generation.path is not None and self.shm.unlink(generation.path):
                log.info("unlinked %s", generation.path)
        self.shm.close()

    # -- requests (server thread) ------------------------------------------------------------
    def status(self, clients_limit: int = STATUS_CLIENTS) -> dict[str, Any]:
        with self._lock:
            current, pending, retiring = self.current, self.pending, list(self.retiring.values())
        header = current.header
        held = self.leases.generations_held()
        return {
            "state": self.state, "generation": current.number, "boot_id": self.boot_id, "version": __version__,
            "pid": os.getpid(), "started_at": self.started_at,
            "checkpoint": current.checkpoint or "<demo>",
            "fingerprint": header.fingerprint if header else None,
            "table_path": current.path if current.state == READY else None,
            "table_bytes": header.total_bytes if header else 0,
            "adopted": current.adopted, "numa_node": self.config.numa_node,
            "shm_dir": self.shm.directory, "files": list(current.files),
            "layers": [entry.layout.to_dict() for entry in header.layers] if header else [],
            "load": current.progress.snapshot(),
            "reload": pending.describe(held.get(pending.number, 0)) if pending else None,
            "generations": [g.describe(held.get(g.number, 0)) for g in (current, *retiring)],
            "clients": self.leases.describe(clients_limit), "clients_total": len(self.leases),
            "lease_seconds": self.config.lease_seconds,
            "events_endpoint": self.config.events_endpoint,
            "error": current.error,
        }

    def attach(self, pid: int, host: str, rank: int | None, device: str, peer: bytes = b"") -> dict[str, Any]:
        current = self.current
        if self.stopping or current.state != READY:
            raise NotReadyError(f"no table to attach to: state is {self.state}"
                                + (f" ({current.error})" if current.error else ""))
        lease = self.leases.grant(pid, host, rank, device, current.number, peer)
        log.info("client %s attached to generation %d (pid %d on %s, device %s, rank %s)", lease.id,
                 current.number, pid, host, device, rank)
        return {"client_id": lease.id, "lease_secret": lease.secret, "lease_seconds": self.config.lease_seconds,
                "boot_id": self.boot_id,
                "generation": current.number, "table_path": current.path, "fingerprint": current.header.fingerprint}

    def heartbeat(self, client_id: str, secret: str = "") -> dict[str, Any]:
        lease = self.leases.renew(client_id, secret)
        if lease is None:
            raise UnknownClientError(f"no lease {client_id!r}: it expired or was granted by an earlier daemon; attach again")
        return {"boot_id": self.boot_id, "generation": self.generation, "lease_generation": lease.generation,
                "lease_seconds": self.config.lease_seconds}

    def detach(self, client_id: str, secret: str = "") -> dict[str, Any]:
        if not self.leases.release(client_id, secret):
            raise UnknownClientError(f"no lease {client_id!r} to detach")
        log.info("client %s detached", client_id)
        return {"detached": client_id}
