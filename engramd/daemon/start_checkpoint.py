"""What a start serves: the reload roots a checkpoint must lie under, and the checkpoint a
daemon started with a config loads first (--checkpoint, or the reload target a predecessor
recorded).  The daemon's start and ``serve --print-config`` both ask here; nothing is created.
"""
from __future__ import annotations

import os

from engram_client.core.errors import ProtocolError

from .config import ServeConfig
from ..shm.private_dir import existing_files_directory
from .served_record import record_path, resume_checkpoint
from ..shm.table_files import instance_id


def allowed_checkpoint(checkpoint: str, reload_roots: list[str]) -> str:
    """Only directories under the configured reload roots may be read."""
    real = os.path.realpath(checkpoint)
    for root in reload_roots:
        root = os.path.realpath(root)
        if real == root or real.startswith(root.rstrip("/") + "/"):
            if not os.path.isdir(real):
                raise ProtocolError(f"reload checkpoint {checkpoint}: no such directory")
            return real
    allowed = ", ".join(reload_roots) or "none configured (--reload-root)"
    raise ProtocolError(f"reload checkpoint {checkpoint} is outside the reload roots ({allowed})")


def served_record_path(config: ServeConfig) -> str:
    """Where the served record of ``config``'s instance is now, found without creating anything
    (``--print-config`` asks before any daemon made its files directory)."""
    shm_dir, instance = os.path.abspath(config.shm_dir), instance_id(config.endpoint)
    path = record_path(existing_files_directory(shm_dir, instance) or shm_dir, instance)
    return path if os.path.lexists(path) else record_path(shm_dir, instance)


def first_checkpoint(config: ServeConfig) -> tuple[str | None, str | None]:
    """What a daemon started with ``config`` loads first, and why where that is not --checkpoint
    (the daemon's start and ``serve --print-config`` both ask here)."""
    return resume_checkpoint(served_record_path(config), config.checkpoint,
                             lambda checkpoint: allowed_checkpoint(checkpoint, config.reload_roots))
