"""Attached clients and their leases: who holds the table, and until when.

A lease has a public id (listed in status, never enough to act on it) and a secret that
only the attaching client receives; renewing or releasing a lease takes both.  Ids carry
a random part, so a new daemon never hands out an id an old one did.
"""
from __future__ import annotations

import hmac
import itertools
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from ..guards.lease_limits import PER_PEER, PER_PROCESS, PER_USER, TOTAL, Holder, LeaseLimitError

REPORTS = ("budget", "cache")  # what a heartbeat may report, kept on its lease


@dataclass
class Lease:
    id: str
    pid: int
    host: str
    rank: int | None
    device: str
    generation: int
    secret: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)
    holder: Holder = Holder()  # the connection (and process, user) that attached it
    attached_at: float = field(default_factory=time.time)
    renewed_at: float = field(default_factory=time.monotonic)
    budget: dict | None = None  # the gather budget counters its heartbeats report (protocol 1.3)
    cache: dict | None = None  # its HBM row cache's counters, as its heartbeats report them (1.4)
    numa_node: int | None = None  # the client's NUMA node, as it said at attach (protocol 1.4)
    replica: dict | None = None  # {"node", "path"}: the table replica it maps (daemon/replicas.py)

    def to_dict(self, now: float) -> dict[str, Any]:
        return {"id": self.id, "pid": self.pid, "host": self.host, "rank": self.rank, "device": self.device,
                "generation": self.generation, "attached_at": self.attached_at,
                "last_heartbeat_age_s": round(now - self.renewed_at, 3), "budget": self.budget,
                "cache": self.cache, "numa_node": self.numa_node, "replica": self.replica}


class LeaseRegistry:
    """The leases granted, by lease id (``client_id`` on the wire).  Only the server thread touches it;
    other threads read the status snapshot (status_report.py)."""

    def __init__(self, lease_seconds: float):
        self.lease_seconds = lease_seconds
        self._leases: dict[str, Lease] = {}
        self._ids = itertools.count(1)

    def grant(self, pid: int, host: str, rank: int | None, device: str, generation: int,
              holder: Holder = Holder(), numa_node: int | None = None, replica: dict | None = None) -> Lease:
        if len(self._leases) >= TOTAL:
            raise LeaseLimitError(f"the daemon holds {TOTAL} leases, its limit; detach unused clients first")
        self._check_holder(holder)
        lease = Lease(f"c{next(self._ids)}-{secrets.token_hex(4)}", pid, host, rank, device, generation,
                      holder=holder, numa_node=numa_node, replica=replica)
        self._leases[lease.id] = lease
        return lease

    def _check_holder(self, holder: Holder) -> None:
        by_peer = by_process = by_user = 0
        for lease in self._leases.values():
            held = lease.holder
            by_peer += bool(holder.connection) and held.connection == holder.connection
            by_process += holder.pid is not None and held.pid == holder.pid
            by_user += holder.uid is not None and held.uid == holder.uid
        if by_peer >= PER_PEER:
            raise LeaseLimitError(f"this connection holds {PER_PEER} leases, the limit for one connection")
        if by_process >= PER_PROCESS:
            raise LeaseLimitError(f"this process (pid {holder.pid}) holds {PER_PROCESS} leases, "
                                  "the limit for one process")
        if by_user >= PER_USER:
            raise LeaseLimitError(f"the processes of uid {holder.uid} hold {PER_USER} leases, the limit for one "
                                  f"user (the rest of the daemon's {TOTAL} are kept for other users)")

    def _held(self, client_id: str, secret: str) -> Lease | None:
        lease = self._leases.get(client_id)
        if lease is None or not hmac.compare_digest(lease.secret.encode(), secret.encode()):
            return None
        return lease

    def renew(self, client_id: str, secret: str, reports: dict[str, dict | None] | None = None) -> Lease | None:
        """Renew a lease; ``reports``: the counters its heartbeat carries (``budget``: gather_budget.py,
        ``cache``: cache_report.py), each kept until the next one that carries it."""
        lease = self._held(client_id, secret)
        if lease is not None:
            lease.renewed_at = time.monotonic()
            for name, report in (reports or {}).items():
                if name not in REPORTS:
                    raise ValueError(f"no report {name!r} on a lease")
                if report is not None:
                    setattr(lease, name, report)
        return lease

    def release(self, client_id: str, secret: str) -> bool:
        if self._held(client_id, secret) is None:
            return False
        del self._leases[client_id]
        return True

    def expire(self) -> list[Lease]:
        deadline = time.monotonic() - self.lease_seconds
        gone = [lease for lease in self._leases.values() if lease.renewed_at < deadline]
        for lease in gone:
            del self._leases[lease.id]
        return gone

    def generations_held(self) -> dict[int, int]:
        """Generation -> number of leases on it."""
        held: dict[int, int] = {}
        for lease in self._leases.values():
            held[lease.generation] = held.get(lease.generation, 0) + 1
        return held

    def describe(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The oldest ``limit`` leases (all if None), as status lists them."""
        now = time.monotonic()
        leases = list(self._leases.values())[:limit]
        return [lease.to_dict(now) for lease in leases]

    def __len__(self) -> int:
        return len(self._leases)
