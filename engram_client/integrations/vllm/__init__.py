"""engramd's vLLM plugin: vLLM 0.33.0's and 0.34.0's DeepSeek-V4.1 Engram tables served by the node's engramd.

Registered as the ``engramd`` entry point of the ``vllm.general_plugins`` group, so vLLM calls
``register()`` in every process it starts.  It does nothing unless ``ENGRAMD_VLLM=1``
(settings.py); then it checks the vLLM version and every signature and call it relies on
(fence.py, against that release's Fence in fences.py), refusing with IntegrationError on a
mismatch, and patches
``vllm.models.deepseek_v41.common.engram`` (patches.py):

- ``DPSharedEngramStorage`` becomes ``EngramdStorage`` (storage.py): instead of rank 0 writing a
  /dev/shm file, every rank attaches to engramd registering only its TP heads' rows
  (head_split.py, building.py), and the weight loader checks the checkpoint's tensors against the served
  table instead of copying them (integrations/rank/weights.py, shared with the SGLang plugin);
- ``ParallelEngramEmbedding.__init__`` refuses what engramd cannot serve (embedding.py);
- vLLM's room check for a table of its own (``check_shm_free_space`` in 0.33.0,
  ``_shm_shortfall`` in 0.34.0) passes: vLLM writes none;
- ``Engram._start_prefetch`` and ``ParallelEngramEmbedding.lookup`` look rows up on engramd's
  host path, vLLM's DEAD ids as zero rows (lookups.py); ``_finish_prefetch`` / ``_ready_rows``
  stay vLLM's.

vLLM and torch are imported only inside ``register()``'s work, so loading the entry point costs
nothing when the plugin is off.

Must not import: ``engramd``, ``engram_client.tools``, ``engram_client.integrations.sglang``.
"""
from __future__ import annotations

from .settings import enabled


def register() -> None:
    """vLLM's general-plugin hook; safe to call many times (vLLM does, once per process)."""
    if not enabled():
        return
    from .patches import apply

    apply()
