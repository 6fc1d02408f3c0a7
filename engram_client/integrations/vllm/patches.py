"""Applying the plugin to the vLLM this process imported: fence first, then five assignments.

What is replaced in ``vllm.models.deepseek_v41.common.engram`` (fence.py checks each first):

- ``DPSharedEngramStorage`` (the module global ``_allocate_weights`` calls) -> EngramdStorage.
  In 0.34.0 this also bypasses vLLM's host-NUMA cuMem table shared by FABRIC handle, which
  only ``DPSharedEngramStorage.__init__`` tries (the fence's ``avoids`` holds vLLM to that);
- the room check ``can_share_engram_tables`` asks before vLLM would write a second copy of the
  table to /dev/shm -> no check (SHM_CHECKS: 0.33.0's ``check_shm_free_space``, 0.34.0's
  ``_shm_shortfall``, which also wants the table to fit in MemAvailable: engramd's table, already
  in tmpfs, is not "available", so vLLM would turn ``dp_shared_memory`` off and never build the
  plugin's storage).  engramd holds the table and checked its own shm dir when it loaded it;
- ``ParallelEngramEmbedding.__init__`` -> wrapped (embedding.py);
- ``ParallelEngramEmbedding.lookup`` and ``Engram._start_prefetch`` -> lookups.py, the latter
  inside the module's own ``eager_break_during_capture``, exactly as vLLM decorates its own.

Idempotent: vLLM loads general plugins in every process and may call them again.
"""
from __future__ import annotations

import importlib
import logging
import threading

from .fence import ENGRAM_MODULE, check_vllm

log = logging.getLogger("engram_client.integrations.vllm")
_lock = threading.Lock()
_applied = False


def no_shm_table(required_bytes, shm_path="/dev/shm", *, allocation_name="shared-memory allocation") -> None:
    """``check_shm_free_space`` (vLLM 0.33.0) for ``can_share_engram_tables``: vLLM writes no table here."""


def no_shm_shortfall(num_bytes) -> None:
    """``_shm_shortfall`` (vLLM 0.34.0) for ``can_share_engram_tables``: nothing is short, vLLM writes no table."""


# vLLM version -> (the name in the engram module that checks room for vLLM's own table, its replacement)
SHM_CHECKS = {"0.33.0": ("check_shm_free_space", no_shm_table), "0.34.0": ("_shm_shortfall", no_shm_shortfall)}


def apply() -> None:
    global _applied
    with _lock:
        if _applied:
            return
        import vllm

        version = str(getattr(vllm, "__version__", "unknown"))
        check_vllm(version)
        engram = importlib.import_module(ENGRAM_MODULE)

        from .embedding import wrap_init
        from .lookups import lookup, start_prefetch
        from .storage import EngramdStorage

        shm_check, replacement = SHM_CHECKS[version]
        engram.DPSharedEngramStorage = EngramdStorage
        setattr(engram, shm_check, replacement)
        engram.ParallelEngramEmbedding.__init__ = wrap_init(engram.ParallelEngramEmbedding.__init__)
        engram.ParallelEngramEmbedding.lookup = lookup
        engram.Engram._start_prefetch = engram.eager_break_during_capture(start_prefetch)
        _applied = True
        log.info("engramd serves vLLM %s's Engram tables (ENGRAMD_VLLM=1)", version)
        log.info("vLLM's specialized decode may run each Engram layer's WKV ahead on engramd's rows: it waits for "
                 "Engram._prefetch_done, which the plugin records once they are in staged_rows")
