"""The vLLM releases the plugin was run against, each as one Fence (engine_fence.py): data only.

Imported by the plugin before it patches (checked live) and by scripts/check_engines.py
(checked on a wheel's sources); so it imports neither vLLM nor torch.
"""
from __future__ import annotations

from engram_client.integrations.engine_fence import Fence

ENGRAM_MODULE = "vllm.models.deepseek_v41.common.engram"

FENCES = {
    "0.33.0": Fence(
        engine="vllm", version="0.33.0",
        signatures={ENGRAM_MODULE: {
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
            "check_shm_free_space": "(required_bytes, shm_path='/dev/shm', *, "
                                    "allocation_name='shared-memory allocation')",
            "eager_break_during_capture": "(fn)",
        }},
        calls={ENGRAM_MODULE: {
            "ParallelEngramEmbedding._allocate_weights": ("DPSharedEngramStorage", "load_weight"),
            "ParallelEngramEmbedding.__init__": ("_allocate_weights", "part_num_embeddings", "vocab_start_idx",
                                                 "head_start", "part_n_hash_cols"),
            "ParallelEngramEmbedding._storage": ("get_views",),
            "Engram.prepare_embeddings": ("_start_prefetch", "lookup", "staged_rows"),
            "Engram._ready_rows": ("_finish_prefetch", "staged_rows"),
            "can_share_engram_tables": ("check_shm_free_space",),
        }},
        names={"vllm.config": ("get_current_vllm_config_or_none",)},
    ),
}
