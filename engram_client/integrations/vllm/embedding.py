"""``ParallelEngramEmbedding.__init__`` under the plugin: what it refuses, around vLLM's own ``__init__``.

Refused before vLLM does anything: a configuration other than ``cpu_offload=True,
dp_shared_memory=True`` (the plugin serves that one; anything else would have vLLM load a
table of its own).  Refused after: an embedding whose storage is not engramd's (vLLM built it
on the meta device, say, without calling the storage at all).  In between, vLLM's ``__init__``
runs as it is, with the embedding and its head sizes kept for the storage (building.py).
"""
from __future__ import annotations

import functools
from typing import Callable

from engram_client import IntegrationError

from .building import building
from .storage import EngramdStorage


def wrap_init(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(self, num_embeddings, dim, head_sizes, block_size=32, cpu_offload=False, dp_shared_memory=False,
                 use_thp=False) -> None:
        if not (cpu_offload and dp_shared_memory):
            raise IntegrationError(
                "engramd's vLLM plugin (ENGRAMD_VLLM=1) serves Engram tables for EngramConfig(cpu_offload=True, "
                f"dp_shared_memory=True); this Engram layer got cpu_offload={cpu_offload}, "
                f"dp_shared_memory={dp_shared_memory}. vLLM turns dp_shared_memory off when the engine's DP "
                "replicas are not on one node or data_parallel_size is 1 (its log says which): run co-located DP "
                "replicas with --engram-config '{\"cpu_offload\": true, \"dp_shared_memory\": true}', or unset "
                "ENGRAMD_VLLM to let vLLM load its own tables")
        with building(self, tuple(int(size) for size in head_sizes)):
            original(self, num_embeddings, dim, head_sizes, block_size, cpu_offload, dp_shared_memory, use_thp)
        if not isinstance(getattr(self, "_shared_memory", None), EngramdStorage):
            raise IntegrationError("vLLM built this Engram layer's table without DPSharedEngramStorage (on the meta "
                                   "device?), so engramd cannot serve it; unset ENGRAMD_VLLM for this load format")

    return __init__
