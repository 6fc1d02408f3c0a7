"""The status reply: built from the daemon's state on the server thread, under the daemon's lock.

The server thread owns the lease registry and changes it between polls; the load
thread hands over generations under the lock.  So the reply is built there, and the
last one built is kept as a snapshot: the Prometheus thread reads that snapshot
(a dict nobody changes after it is built), never the live registry.
"""
from __future__ import annotations

import os
from typing import Any

from engram_client.core.protocol import READY

from .config import ServeConfig
from .generation import Generation
from .leases import LeaseRegistry
from ..loading.token_map import describe_hashing


def build_status(state: str, current: Generation, pending: Generation | None, retiring: list[Generation],
                 leases: LeaseRegistry, config: ServeConfig, boot_id: str, started_at: float, version: str,
                 shm_dir: str, clients_limit: int) -> dict[str, Any]:
    """The status operation's result, as docs/protocol.md describes it; ``clients`` lists at most
    ``clients_limit`` leases (the oldest), ``clients_total`` counts them all."""
    header = current.header
    held = leases.generations_held()
    return {
        "state": state, "generation": current.number, "boot_id": boot_id, "version": version,
        "pid": os.getpid(), "started_at": started_at,
        "checkpoint": current.checkpoint or "<demo>",
        "fingerprint": header.fingerprint if header else None,
        "table_path": current.path if current.state == READY else None,
        "table_bytes": header.total_bytes if header else 0,
        "adopted": current.adopted, "numa_node": config.numa_node,
        "replicas": [r.describe(header.total_bytes) for r in current.served_replicas(config.numa_node)]
        if current.state == READY and header else [],
        "shm_dir": shm_dir, "files": list(current.files),
        "layers": [entry.layout.to_dict() for entry in header.layers] if header else [],
        "hashing": describe_hashing(header.hashing if header else None),
        "load": current.progress.snapshot(),
        "reload": pending.describe(held.get(pending.number, 0)) if pending else None,
        "generations": [g.describe(held.get(g.number, 0)) for g in (current, *retiring)],
        "clients": leases.describe(clients_limit), "clients_total": len(leases),
        "lease_seconds": config.lease_seconds,
        "events_endpoint": config.events_endpoint,
        "error": current.error,
        "hot_rows": current.hot_rows, "hot_rows_error": current.hot_rows_error,
    }
