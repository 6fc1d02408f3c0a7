"""The vLLM releases the plugin was run against, each as one Fence (engine_fence.py): data only.

Imported by the plugin before it patches (checked live, fence.py) and by scripts/check_engines.py
(checked on a wheel's sources); so it imports neither vLLM nor torch.

What 0.34.0 changed on the plugin's paths, read from its wheel against 0.33.0's, and the item
of its fence that holds the plugin to it:

- ``can_share_engram_tables`` asks ``_shm_shortfall`` (free /dev/shm *and* ``MemAvailable``)
  instead of ``check_shm_free_space``: the plugin replaces ``_shm_shortfall`` (patches.py);
- ``DPSharedEngramStorage.__init__`` first tries a host-NUMA cuMem table shared by FABRIC handle
  (``engram_host_table.share_host_table``): replacing the storage bypasses it, as long as the
  embedding reaches that table only through the storage (``avoids``);
- profile and DP dummy runs look up ``NgramHashState.dummy_hashes``, all ``DEAD_ID``: lookups.py
  gives those ids zero rows;
- the specialized decode's ``EngramPrefetch`` runs each layer's WKV on a side stream after
  waiting for ``Engram._prefetch_done`` and reading ``staged_rows``; the plugin records that
  event after engramd's rows land in ``staged_rows``, so the chain reads engramd's rows.
"""
from __future__ import annotations

from engram_client.integrations.engine_fence import Fence

ENGRAM_MODULE = "vllm.models.deepseek_v41.common.engram"
DECODE_PREFETCH_MODULE = "vllm.models.deepseek_v41.nvidia.specialized_decode.engram.prefetch"
DEAD_ID = -1  # vLLM's "no row" id, as both releases define it; lookups.py gives it zero rows

# What the plugin replaces or calls, unchanged from 0.33.0 to 0.34.0.
_SIGNATURES = {
    "DPSharedEngramStorage.__init__": "(self, num_rows, dim, block_size, group)",
    "DPSharedEngramStorage.load_weight": "(self, param, loaded_weight)",
    "DPSharedEngramStorage.get_views": "(self, weight, scales)",
    "ParallelEngramEmbedding.__init__": "(self, num_embeddings, dim, head_sizes, block_size=32, "
                                        "cpu_offload=False, dp_shared_memory=False, use_thp=False)",
    "ParallelEngramEmbedding._allocate_weights": "(self)",
    "ParallelEngramEmbedding.lookup": "(self, indices, out, background=False)",
    "Engram.prepare_embeddings": "(self, hash_ids)",
    "Engram._start_prefetch": "(self, hash_ids, rows)",
    "Engram._finish_prefetch": "(self, event)",
    "Engram._ready_rows": "(self, num_tokens)",
    "can_share_engram_tables": "(layout, block_size=32)",
    "eager_break_during_capture": "(fn)",
}
_CALLS = {
    "ParallelEngramEmbedding._allocate_weights": ("DPSharedEngramStorage", "load_weight"),
    "ParallelEngramEmbedding.__init__": ("_allocate_weights", "part_num_embeddings", "vocab_start_idx",
                                         "head_start", "part_n_hash_cols"),
    "ParallelEngramEmbedding._storage": ("get_views",),
    "Engram.prepare_embeddings": ("_start_prefetch", "lookup", "staged_rows"),
    "Engram._ready_rows": ("_finish_prefetch", "staged_rows"),
    "NgramHashState.dummy_hashes": ("DEAD_ID",),
}
# The specialized decode's WKV chain waits for the event the plugin's _start_prefetch records.
_DECODE_PREFETCH = {
    "signatures": {"prefetchable": "(engram)", "EngramPrefetch.start": "(self, num_tokens)"},
    "calls": {"prefetchable": ("_prefetch_stream", "_prefetch_done"),
              "EngramPrefetch.start": ("_prefetch_done", "wait_event", "staged_rows")},
}
_NAMES = {"vllm.config": ("get_current_vllm_config_or_none",)}
_CONSTANTS = {ENGRAM_MODULE: {"DEAD_ID": DEAD_ID}}

FENCES = {
    "0.33.0": Fence(
        engine="vllm", version="0.33.0",
        signatures={ENGRAM_MODULE: {**_SIGNATURES,
                                    "check_shm_free_space": "(required_bytes, shm_path='/dev/shm', *, "
                                                            "allocation_name='shared-memory allocation')"},
                    DECODE_PREFETCH_MODULE: _DECODE_PREFETCH["signatures"]},
        calls={ENGRAM_MODULE: {**_CALLS, "can_share_engram_tables": ("check_shm_free_space",)},
               DECODE_PREFETCH_MODULE: _DECODE_PREFETCH["calls"]},
        names=_NAMES,
        constants=_CONSTANTS,
    ),
    "0.34.0": Fence(
        engine="vllm", version="0.34.0",
        signatures={ENGRAM_MODULE: {**_SIGNATURES, "_shm_shortfall": "(num_bytes)"},
                    DECODE_PREFETCH_MODULE: _DECODE_PREFETCH["signatures"]},
        calls={ENGRAM_MODULE: {**_CALLS, "can_share_engram_tables": ("_shm_shortfall",),
                               "DPSharedEngramStorage.__init__": ("share_host_table",)},
               DECODE_PREFETCH_MODULE: _DECODE_PREFETCH["calls"]},
        names=_NAMES,
        constants=_CONSTANTS,
        avoids={ENGRAM_MODULE: {
            "ParallelEngramEmbedding.__init__": ("share_host_table", "engram_host_table", "_allocate_shm"),
            "ParallelEngramEmbedding._allocate_weights": ("share_host_table", "engram_host_table", "_allocate_shm"),
        }},
    ),
}
