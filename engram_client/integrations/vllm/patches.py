"""Applying the plugin to the vLLM this process imported: fence first, then five assignments.

What is replaced in ``vllm.models.deepseek_v41.common.engram`` (fence.py checks each first):

- ``DPSharedEngramStorage`` (the module global ``_allocate_weights`` calls) -> EngramdStorage;
- ``check_shm_free_space`` (the module's name for it; ``can_share_engram_tables`` is its only
  caller left, asking room for a second copy of the table in /dev/shm) -> no check: engramd
  holds the table, and checked its own shm dir when it loaded it;
- ``ParallelEngramEmbedding.__init__`` -> wrapped (embedding.py);
- ``ParallelEngramEmbedding.lookup`` and ``Engram._start_prefetch`` -> lookups.py, the latter
  inside the module's own ``eager_break_during_capture``, exactly as vLLM decorates its own.

Idempotent: vLLM loads general plugins in every process and may call them again.
"""
from __future__ import annotations

import importlib
import logging
import threading

from .fence import ENGRAM_MODULE, NAMES, check_names, check_surface, check_version

log = logging.getLogger("engram_client.integrations.vllm")
_lock = threading.Lock()
_applied = False


def no_shm_table(required_bytes, shm_path="/dev/shm", *, allocation_name="shared-memory allocation") -> None:
    """``check_shm_free_space`` for ``can_share_engram_tables``: vLLM writes no table under the plugin."""


def apply() -> None:
    global _applied
    with _lock:
        if _applied:
            return
        import vllm

        version = str(getattr(vllm, "__version__", "unknown"))
        check_version(version)
        engram = importlib.import_module(ENGRAM_MODULE)
        check_surface(engram, version)
        check_names({name: importlib.import_module(name) for name in NAMES}, version)

        from .embedding import wrap_init
        from .lookups import lookup, start_prefetch
        from .storage import EngramdStorage

        engram.DPSharedEngramStorage = EngramdStorage
        engram.check_shm_free_space = no_shm_table
        engram.ParallelEngramEmbedding.__init__ = wrap_init(engram.ParallelEngramEmbedding.__init__)
        engram.ParallelEngramEmbedding.lookup = lookup
        engram.Engram._start_prefetch = engram.eager_break_during_capture(start_prefetch)
        _applied = True
        log.info("engramd serves vLLM %s's Engram tables (ENGRAMD_VLLM=1)", version)
