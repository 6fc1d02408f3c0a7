"""The daemon's state machine and its request handling: generations, clients, the lifecycle.

    loading ──▶ ready ──▶ stopping          (state of the served generation)
       │          │ ▲          ▲
       └▶ failed ─┼─┼──────────┘
                  ▼ │
           reload: g+1 loads beside g; on success g+1 is served and g retires,
                   on failure g goes on and status says why

A start first looks for a complete table its predecessor (same endpoint, same shm dir) left
behind and re-adopts it if it is exactly what would be loaded (load_job.py plans, adopts and
loads).  A retired generation's files (every NUMA replica: replicas.py) are unlinked together
once no lease holds it, or after ``retire_grace_seconds``; ranks mapping them keep their pages.

Loads run on one load thread at a time (a LoadJob); everything else runs on the
server thread.  The load job writes only its generation and hands its outcome over
through ``_finish`` / ``_load_failed``, under ``_lock``.  The status reply is built
on the server thread under the same lock (status_report.py) and kept as the
snapshot the metrics thread reads.

Owns the table files it creates; the socket belongs to server.py.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Callable

from engram_client.core.errors import NotReadyError, UnknownClientError
from engram_client.core.numa_nodes import pick_replica
from engram_client.core.protocol import FAILED, LOADING, READY, STOPPING

from .. import __version__
from .config import ServeConfig
from .daemon_exit import LOAD_STOP_S
from .generation import Generation
from ..guards.lease_limits import STATUS_CLIENTS, Holder
from .leases import LeaseRegistry
from .load_job import LoadJob, LoadThread
from ..reporting.metrics import NoMetrics
from .served_record import prepare_record, write_record
from .start_checkpoint import allowed_checkpoint, first_checkpoint
from .status_report import build_status
from ..shm.hot_rows_file import attach_view
from ..shm.table_files import ShmDir, instance_id

log = logging.getLogger("engramd")


class Daemon:
    def __init__(self, config: ServeConfig, on_state_change: Callable[[str], None] | None = None, metrics=None):
        self.config = config
        self.metrics = metrics or NoMetrics()
        self.boot_id = uuid.uuid4().hex
        self.started_at = time.time()
        self.leases = LeaseRegistry(config.lease_seconds)
        self.stop_requested = threading.Event()
        self.stopping = False
        self.current = Generation(0, config.checkpoint)  # replaced by start_load
        self.pending: Generation | None = None  # a reload's generation, while loading or after failing
        self.retiring: dict[int, Generation] = {}
        self._last_number = 0
        self._cancel_load = threading.Event()
        self._lock = threading.Lock()
        self._load_thread: LoadThread | None = None
        self._on_state_change = on_state_change or (lambda state: None)
        self.shm = ShmDir(config.shm_dir, instance_id(config.endpoint), 0o640 if config.gid is not None else 0o600,
                          config.gid)
        self._served_record = prepare_record(self.shm.files_dir, self.shm.directory, self.shm.instance)
        for path in self.shm.remove_orphans():
            log.warning("cleaned up %s, left behind by a daemon that died", path)
        self._snapshot: dict[str, Any] = {}
        self.budget = None  # the node's gather budget (engramd/daemon/gather_budget.py), set by the server
        self.status()

    # -- derived views ---------------------------------------------------------------
    @property
    def state(self) -> str:
        return STOPPING if self.stopping else self.current.state

    @property
    def generation(self) -> int:
        return self.current.number

    @property
    def error(self) -> str | None:
        """Why the served generation failed, if it did."""
        return self.current.error

    def load_progress(self) -> dict[str, int]:
        """Bytes loaded so far of the served generation (a reload's own progress is in status)."""
        return self.current.progress.snapshot()

    def loading_generation(self) -> Generation | None:
        """The generation whose load is running (the first load, or a reload beside the served one), or None."""
        with self._lock:
            for generation in (self.pending, self.current):
                if generation is not None and generation.state == LOADING and generation.progress.total_bytes:
                    return generation
        return None

    def request_stop(self) -> None:
        """Ask the server loop to stop after its current poll (any thread, signal handlers included)."""
        self.stop_requested.set()

    def stop_is_requested(self) -> bool:
        return self.stop_requested.is_set()

    # -- loading ---------------------------------------------------------------------
    def _announce(self) -> None:
        log.info("state -> %s (generation %d)", self.state, self.generation)
        self._on_state_change(self.state)

    def start_load(self) -> None:
        """The first load of this process: re-adopt a predecessor's table, or load afresh."""
        checkpoint, why = first_checkpoint(self.config)
        if why is not None:  # a record the operator may not know of decided (or tried to): say so where they look
            configured = f"--checkpoint {self.config.checkpoint}" if self.config.checkpoint else "the demo table"
            if checkpoint == self.config.checkpoint:
                log.warning("serving %s: %s", configured, why)
            else:
                log.warning("serving %s, not %s: %s", checkpoint, configured, why)
        self._begin(Generation(self._next_number(), checkpoint), first=True)

    def _next_number(self) -> int:
        self._last_number += 1
        return self._last_number

    def _begin(self, generation: Generation, first: bool = False) -> None:
        if first:
            with self._lock:
                self.current = generation
        job = LoadJob(generation, self.config, self.shm, self.metrics, self._cancel_load, on_ready=self._finish,
                      on_failed=self._load_failed, may_adopt=first)
        self._load_thread = LoadThread(job)
        self._load_thread.start()

    def _finish(self, generation: Generation) -> None:
        """Serve a freshly complete generation; the one it replaces starts retiring.  (Load thread.)

        What is served is recorded first: once a client can see a generation (status, attach,
        the event), a restart serves it too.  A record that cannot be written fails the generation."""
        try:
            write_record(self._served_record, self.config.checkpoint, generation.checkpoint)
        except OSError as exc:
            self._not_recorded(generation, exc)
            return
        generation.measure_huge_pages()
        with self._lock:
            generation.state = READY
            self._last_number = max(self._last_number, generation.number)  # a re-adopted table keeps its number
            previous = self.current
            if generation is not previous:
                if previous.path is not None:
                    previous.retired_at = time.monotonic()
                    self.retiring[previous.number] = previous
                self.current, self.pending = generation, None
        self.metrics.reload_finished(generation, "served")
        self._announce()

    def _not_recorded(self, generation: Generation, exc: OSError) -> None:
        generation.error = (f"cannot record what is served in {self._served_record}: {exc.strerror or exc}; "
                            f"generation {generation.number} is not served, so that a restart cannot roll clients "
                            "back from it")
        generation.state = FAILED
        log.error("generation %d failed: %s", generation.number, generation.error)
        if generation.path is not None and not generation.adopted:
            for path in generation.paths():
                self.shm.unlink(path)
            generation.path, generation.replicas = None, []
        self._load_failed(generation)

    def _load_failed(self, generation: Generation) -> None:
        """A failed reload leaves the served generation alone; only a failed served one is news.  (Load thread.)"""
        self.metrics.reload_finished(generation, "failed")
        if generation is self.current:
            self._announce()

    def reload(self, checkpoint: str | None) -> dict[str, Any]:
        """Load generation g+1 beside the served one; it takes over once complete."""
        if self.stopping:
            raise NotReadyError("the daemon is stopping")
        if self._load_thread is not None and self._load_thread.busy():
            raise NotReadyError("a load is already in progress; wait for it (see status) before reloading")
        source = allowed_checkpoint(checkpoint, self.config.reload_roots) if checkpoint is not None else \
            self.current.checkpoint
        generation = Generation(self._next_number(), source, by_reload=True)
        with self._lock:
            if self.current.state == READY:
                self.pending = generation  # the served generation goes on meanwhile
            else:
                if self.current.path is not None:  # a served file that failed: removed once no lease holds it
                    self.current.retired_at = time.monotonic()
                    self.retiring[self.current.number] = self.current
                self.current, self.pending = generation, None  # nothing served: this becomes the load
        if generation is self.current:
            self._announce()
        log.info("reload: generation %d from %s", generation.number, source or "<demo>")
        self._begin(generation)
        return {"generation": generation.number, "checkpoint": source or "<demo>"}

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
            if number not in held or grace_over:  # every replica of a generation goes together
                for path in generation.paths():
                    self.shm.unlink(path)
                del self.retiring[number]
                log.info("removed generation %d's table %s (%s)", number, " and ".join(generation.paths()),
                         "grace period over" if number in held else "no client holds it")
        self.status()  # refresh the snapshot the metrics thread reads

    def shutdown(self) -> None:
        """Enter 'stopping', cancel any load, unlink our tables; mapped clients keep their pages."""
        if not self.stopping:
            self.stopping = True
            self._announce()
        self._cancel_load.set()
        if self._load_thread is not None:
            self._load_thread.join(timeout=LOAD_STOP_S)
            if self._load_thread.is_alive():
                log.error("load thread did not stop within %.0f s; exiting anyway", LOAD_STOP_S)
        for generation in [self.current, *self.retiring.values()]:
            for path in generation.paths():
                if self.shm.unlink(path):
                    log.info("unlinked %s", path)
        self.close()

    def close(self) -> None:
        """Let go of the shm dir (its lock); table files stay as they are."""
        self.shm.close()

    # -- requests (server thread) ------------------------------------------------------------
    def _check_served_file(self) -> None:
        """Before status and attach: a served file cut or removed under us fails its generation."""
        current = self.current
        problem = current.file_problem()
        if problem is None:
            return
        with self._lock:
            if self.current is not current or current.state != READY:
                return  # a load finished meanwhile: the next check looks at the new one
            current.state, current.error = FAILED, problem
        log.error("generation %d failed: %s", current.number, problem)
        self._announce()

    def status(self, clients_limit: int = STATUS_CLIENTS) -> dict[str, Any]:
        """The status reply, built now (server thread); also kept as the snapshot metrics read."""
        self._check_served_file()
        with self._lock:
            self._snapshot = build_status(self.state, self.current, self.pending, list(self.retiring.values()),
                                          self.leases, self.config, self.boot_id, self.started_at, __version__,
                                          self.shm.directory, clients_limit)
            self._snapshot.update(gather_budget=self.budget.status() if self.budget else None,
                                  huge_pages=self.current.huge_pages)
            return self._snapshot

    def snapshot(self) -> dict[str, Any]:
        """The status last built on the server thread; safe to read from any thread."""
        with self._lock:
            return self._snapshot

    def attach(self, pid: int, host: str, rank: int | None, device: str, peer: Holder = Holder(),
               numa_node: int | None = None) -> dict[str, Any]:
        self._check_served_file()
        current = self.current
        if self.stopping or current.state != READY:
            raise NotReadyError(f"no table to attach to: state is {self.state}"
                                + (f" ({current.error})" if current.error else ""))
        replicas = [{"node": r.node, "path": r.path} for r in current.served_replicas(self.config.numa_node)]
        replica = pick_replica(replicas, current.path, numa_node)  # the rule the client maps by, too
        lease = self.leases.grant(pid, host, rank, device, current.number, peer, numa_node, replica)
        log.info("client %s attached to generation %d (pid %d on %s, device %s, rank %s, replica %s)", lease.id,
                 current.number, pid, host, device, rank, replica["path"])
        return {"client_id": lease.id, "lease_secret": lease.secret, "lease_seconds": self.config.lease_seconds,
                "boot_id": self.boot_id, "generation": current.number, "table_path": current.path, "replicas": replicas,
                "fingerprint": current.header.fingerprint, "hot_rows": attach_view(current.hot_rows),
                "budget": self.budget.describe() if self.budget is not None else None}

    def heartbeat(self, client_id: str, secret: str = "", **reports: dict | None) -> dict[str, Any]:
        lease = self.leases.renew(client_id, secret, reports)  # budget, cache: the client's counters
        if lease is None:
            raise UnknownClientError(f"no lease {client_id!r}: it expired or was granted by an earlier daemon; attach again")
        return {"boot_id": self.boot_id, "generation": self.generation, "lease_generation": lease.generation,
                "lease_seconds": self.config.lease_seconds}

    def detach(self, client_id: str, secret: str = "") -> dict[str, Any]:
        if not self.leases.release(client_id, secret):
            raise UnknownClientError(f"no lease {client_id!r} to detach")
        log.info("client %s detached", client_id)
        return {"detached": client_id}
