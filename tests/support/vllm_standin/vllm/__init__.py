"""A stand-in for vLLM 0.33.0 and 0.34.0, for engramd's tests: the few modules engramd's vLLM plugin touches.

This is NOT vLLM.  vLLM's Engram code runs on GPUs only (its UVA lookup kernel, its pinned /dev/shm
storage), and vLLM is not installed where the tests run; so these modules replay vLLM 0.33.0's
call sequence around the classes the plugin patches, with vLLM's module paths, names and
signatures (the plugin's fence checks them here as it does in vLLM), written from reading
vLLM 0.33.0's and 0.34.0's sources.  ``STANDIN_VLLM_VERSION`` (default 0.33.0) says which
release it is; ``REPLAYED`` is the release whose call sequence runs (0.34.0's for any version
but 0.33.0, so that a version test sees the newest calls):

- ``vllm.plugins.load_general_plugins``: the ``vllm.general_plugins`` entry points, loaded and called;
- ``vllm.models.deepseek_v41.common.engram``: ``ParallelEngramEmbedding`` (the TP head split, the
  storage built as ``DPSharedEngramStorage(num_rows, dim, block_size, group)`` with the Engram DP
  group, the parameters and their weight loader, ``_storage`` -> ``get_views``),
  ``Engram`` (``prepare_embeddings`` -> ``_start_prefetch`` on a shared prefetch stream,
  ``_ready_rows`` -> ``_finish_prefetch``, ``embed``'s TP all-gather of heads),
  ``can_share_engram_tables`` and ``check_shm_free_space``;
- ``vllm.models.deepseek_v41.nvidia.model``: the model's Engram steps (``__init__``,
  ``load_weights`` from real safetensors files, the forward's prefetch of every layer);
- ``vllm.models.deepseek_v41.nvidia.ops.engram_host_table``: 0.34.0's host-NUMA cuMem table,
  counting the calls that reach it;
- ``vllm.models.deepseek_v41.nvidia.specialized_decode.engram.prefetch``: the decode's WKV
  chain, ahead of the layers, on a side stream after ``_prefetch_done``;
- ``vllm.utils.cpu_resource_utils.get_available_memory`` (0.34.0's available-memory check);
- ``vllm.distributed``: TP and Engram DP groups over real torch.distributed gloo groups.

What it does not replay, because the plugin replaces it: vLLM's own /dev/shm storage and its
Triton lookup kernel (both raise here), nor anything else of the model (hashing, wkv, attention).
"""
import os

__version__ = os.environ.get("STANDIN_VLLM_VERSION", "0.33.0")
REPLAYED = "0.33.0" if __version__ == "0.33.0" else "0.34.0"
