"""Attached clients and their leases: who holds the table, and until when."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Lease:
    id: str
    pid: int
    host: str
    rank: int | None
    device: str
    generation: int
    attached_at: float = field(default_factory=time.time)
    renewed_at: float = field(default_factory=time.monotonic)

    def to_dict(self, now: float) -> dict[str, Any]:
        return {"id": self.id, "pid": self.pid, "host": self.host, "rank": self.rank, "device": self.device,
                "generation": self.generation, "attached_at": self.attached_at,
                "last_heartbeat_age_s": round(now - self.renewed_at, 3)}


class LeaseRegistry:
    """The leases granted, by lease id (``client_id`` on the wire).  Only the server thread touches it;
    other threads read the status snapshot (status_report.py)."""

    def __init__(self, lease_seconds: float):
        self.lease_seconds = lease_seconds
        self._leases: dict[str, Lease] = {}
        self._ids = itertools.count(1)

    def grant(self, pid: int, host: str, rank: int | None, device: str, generation: int) -> Lease:
        lease = Lease(f"c{next(self._ids)}-{pid}", pid, host, rank, device, generation)
        self._leases[lease.id] = lease
        return lease

    def renew(self, client_id: str) -> Lease | None:
        lease = self._leases.get(client_id)
        if lease is not None:
            lease.renewed_at = time.monotonic()
        return lease

    def release(self, client_id: str) -> bool:
        return self._leases.pop(client_id, None) is not None

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

    def describe(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [lease.to_dict(now) for lease in self._leases.values()]

    def __len__(self) -> int:
        return len(self._leases)
