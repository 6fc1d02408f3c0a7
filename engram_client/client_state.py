"""The client's whole state, apart from the client object: lease, mapping, tables, hasher, heartbeat.

EngramClient holds one ClientState and registers ``release`` as its finalizer, so the
state must never refer back to the client: garbage collection of the client then
still detaches, unregisters and unmaps.  The heartbeat thread runs ``heartbeat_loop``:
it keeps the lease, re-attaches after a daemon restart, and flags a refresh when the
daemon serves another generation than the one mapped.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any

from .attach.connection import DaemonConnection
from .core.errors import EngramError, NotAttachedError, ProtocolError, UnknownClientError
from .core.numa_nodes import pick_replica
from .attach.fork_guard import release_in_forked_child, single_thread_torch_after_fork
from .hashing.hasher import UnavailableHasher
from .attach.mapped_generation import MappedGeneration
from .lookup.layer_table import LayerTable

log = logging.getLogger("engram_client")
REATTACH_FIELDS = ("client_id", "boot_id", "fingerprint", "generation")  # what a re-attach reads of the reply


class ClientState:
    """Everything a client holds, apart from the client object, so a finalizer can release it."""

    def __init__(self, connection: DaemonConnection):
        single_thread_torch_after_fork()  # before any lookup of this process can wait on the parent's threads
        self.connection = connection
        self.mapped: MappedGeneration | None = None
        self.tables: dict[int, LayerTable] = {}  # what client.table() hands out wraps these
        self.stream = None
        self.pool = None  # the gather threads of the host path and of CPU lookups
        self.seat = None  # the pool's seat on the node's gather budget (gather_seat.py)
        self.device = None
        self.stop = threading.Event()
        self.heartbeat_thread: threading.Thread | None = None
        self.boot_id: str | None = None
        self.lease_lost = False
        self._problem: str | None = None  # what the heartbeat thread last logged going wrong, until it recovers
        self._failures = 0  # heartbeats and re-attaches that failed since the last success
        self.refresh_pending = False  # the daemon serves another generation than the one mapped
        self.attach_args: dict[str, Any] = {}
        self.numa_node: int | None = None  # this rank's NUMA node: which table replica it maps (numa_nodes.py)
        self.hasher: Any = UnavailableHasher("the client is not attached")
        self.lock = threading.RLock()  # refresh vs heartbeat re-attach
        self.owner_pid = os.getpid()  # a forked child releases differently (fork_guard)

    @property
    def client_id(self) -> str | None:
        return self.mapped.lease_id if self.mapped is not None else None

    def heartbeat_loop(self, interval: float) -> None:
        while not self.stop.wait(interval):
            try:
                self._beat(interval)
            except Exception as exc:  # a bug or a reply of an unexpected shape: the thread keeping the lease goes on
                self.lease_lost = True
                self._trouble(f"a heartbeat failed unexpectedly ({type(exc).__name__}: {exc})")

    def _beat(self, interval: float) -> None:
        """One heartbeat: renew the lease with the counters; re-attach or flag a refresh as the reply says."""
        try:
            args = self.lease_args()
            report = (self.seat.report(self.connection.daemon_version)
                      if self.seat is not None and self.mapped is not None else None)
            if report is not None:
                args["budget"] = report  # counters for status and metrics (protocol 1.3)
            if self.mapped is not None and self.pool is not None:
                args["cache"] = self.cache_report()  # the HBM cache's counters (protocol 1.4)
            reply = self.connection.request("heartbeat", args, timeout=interval)
            self.lease_lost = False
        except UnknownClientError:
            self._reattach()
        except EngramError as exc:
            self.lease_lost = True
            self._trouble(f"heartbeat to engramd failed: {exc}")
        else:
            if (note := self._recovered()):
                log.info("engramd answers heartbeats again%s", note)
            if reply.get("boot_id") != self.boot_id:
                self._reattach()
            elif self.mapped is not None and reply.get("generation") != self.mapped.generation:
                self.refresh_pending = True

    def cache_report(self) -> dict:
        from .lookup.cache.layer_caches import cache_report

        return cache_report(self.pool, [t.hbm_cache for t in list(self.tables.values()) if t.hbm_cache is not None])

    def _reattach(self) -> None:
        """The daemon does not know our lease (it expired, or a new daemon runs): attach again.
        The new lease is on whatever the daemon serves now; if that is not the table we map,
        we keep serving from ours and flag a refresh."""
        with self.lock:
            try:
                reply = self.connection.request("attach", self.attach_args, timeout=2.0)
            except EngramError as exc:
                self.lease_lost = True
                self._trouble(f"could not re-attach to engramd: {exc}")
                return
            mapped = self.mapped
            try:
                missing = [field for field in REATTACH_FIELDS if field not in reply]
                if missing:
                    raise ProtocolError(f"the daemon's attach reply lacks {', '.join(missing)}")
                path = self.replica(reply)["path"] if mapped is not None else None
            except EngramError as exc:  # a reply this client cannot use: give its lease back, retry next beat
                if "client_id" in reply:
                    self.detach_quietly(reply["client_id"], reply.get("lease_secret", ""))
                self.lease_lost = True
                self._trouble(f"could not re-attach to engramd: {exc}")
                return
            if self.seat is not None and self.pool is not None:
                from .lookup.host.gather_seat import move_seat

                move_seat(self.seat, self.pool, reply.get("budget"), self.device)  # a new daemon, a new budget
            if mapped is not None:
                mapped.lease_id, mapped.lease_secret = reply["client_id"], reply.get("lease_secret", "")
                if (path, reply["fingerprint"]) != (mapped.path, mapped.fingerprint) or not same_file(path, mapped):
                    self.refresh_pending = True
                else:
                    mapped.generation = reply["generation"]
            # The boot id last: whoever sees the new daemon's boot id also sees the lease it granted.
            self.boot_id, self.lease_lost = reply["boot_id"], False
            if mapped is None:
                return
            log.info("re-attached to engramd (boot %s) as %s%s%s", reply["boot_id"], mapped.lease_id,
                     "; a refresh is pending" if self.refresh_pending else "", self._recovered())

    def _trouble(self, problem: str) -> None:
        """Log a problem of the heartbeat thread once, not at every beat while it lasts (the thread
        retries each beat; a daemon that stays failed would fill the log with the same line)."""
        self._failures += 1
        if problem != self._problem:
            log.warning("%s (retrying at every heartbeat; logged again only if this changes)", problem)
            self._problem = problem

    def _recovered(self) -> str:
        """'' if nothing went wrong since the last success, else a note that it is over (logged once)."""
        if self._problem is None:
            return ""
        note = f" (after {self._failures} failed attempts; the last: {self._problem})"
        self._problem, self._failures = None, 0
        return note

    def replica(self, reply: dict) -> dict:
        """{"node", "path"}: the replica this rank maps of those an attach or status reply lists."""
        return pick_replica(reply.get("replicas"), reply["table_path"], self.numa_node)

    def lease_args(self) -> dict[str, str | None]:
        """The lease's id and the secret that proves it is ours (protocol 1.2)."""
        mapped = self.mapped
        return {"client_id": mapped.lease_id, "secret": mapped.lease_secret} if mapped is not None else \
            {"client_id": None}

    def status(self, timeout: float) -> dict[str, Any]:
        """The daemon's status; a closed client's connection must not open again behind the caller's back."""
        if self.mapped is None:
            raise NotAttachedError("client is closed")
        return self.connection.request("status", timeout=timeout)

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
                for table in self.tables.values():
                    # a table kept past close must not read unmapped rows: it raises NotAttachedError
                    table._retire("the client this table belongs to is closed; make a new EngramClient")
                self.tables.clear()
                self.mapped.release()
                self.mapped = None
            if self.pool is not None:
                self.pool.close()
            self.hasher = UnavailableHasher("the client is closed")
            self.connection.close()


def same_file(path: str, mapped: MappedGeneration) -> bool:
    """Whether ``path`` is still the file we mapped (a restarted daemon may reuse the name)."""
    if mapped.mapping is None:
        return False
    try:
        return os.stat(path).st_ino == mapped.mapping.inode
    except OSError:
        return False
