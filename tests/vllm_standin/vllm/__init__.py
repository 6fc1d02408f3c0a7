"""A stand-in for vLLM 0.33.0, for engramd's tests: the few modules engramd's vLLM plugin touches.

This is NOT vLLM.  vLLM's Engram code runs on GPUs only (its UVA lookup kernel, its pinned /dev/shm
storage), and vLLM is not installed where the tests run; so these modules replay vLLM 0.33.0's
call sequence around the classes the plugin patches, with vLLM's module paths, names and
signatures (the plugin's fence checks them here as it does in vLLM), written from reading
vLLM 0.33.0's sources:

- ``vllm.plugins.load_general_plugins``: the ``vllm.general_plugins`` entry points, loaded and called;
- ``vllm.models.deepseek_v41.common.engram``: ``ParallelEngramEmbedding`` (the TP head split, the
  storage built as ``DPSharedEngramStorage(num_rows, dim, block_size, group)`` with the Engram DP
  group, the parameters and their weight loader, ``_storage`` -> ``get_views``),
  ``Engram`` (``prepare_embeddings`` -> ``_start_prefetch`` on a shared prefetch stream,
  ``_ready_rows`` -> ``_finish_prefetch``, ``embed``'s TP all-gather of heads),
  ``can_share_engram_tables`` and ``check_shm_free_space``;
- ``vllm.models.deepseek_v41.nvidia.model``: the model's Engram steps (``__init__``,
  ``load_weights`` from real safetensors files, the forward's prefetch of every layer);
- ``vllm.distributed``: TP and Engram DP groups over real torch.distributed gloo groups.

What it does not replay, because the plugin replaces it: vLLM's own /dev/shm storage and its
Triton lookup kernel (both raise here), nor anything else of the model (hashing, wkv, attention).
``STANDIN_VLLM_VERSION`` overrides ``__version__``, to test the plugin's version fence.
"""
import os

__version__ = os.environ.get("STANDIN_VLLM_VERSION", "0.33.0")
