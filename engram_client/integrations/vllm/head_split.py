"""vLLM's split of an Engram layer's heads over TP ranks, served by the process's one client.

vLLM shards an Engram layer's heads over TP ranks: ``part_n_hash_cols = cdiv(heads, tp)`` heads
from ``head_start = tp_rank * part_n_hash_cols`` (the last rank may get fewer, vLLM pads the
rest with zeros), i.e. rows ``[vocab_start_idx, vocab_end_idx)`` of the layer.  The first
embedding vLLM builds attaches the client with that split (integrations/rank/rank_client.py).
"""
from __future__ import annotations

import logging

from engram_client.integrations.rank.rank_client import Engine, ProcessClient, RankClient

from .settings import ENABLE_VARIABLE

ENGINE = Engine("vLLM", "heads", f": unset {ENABLE_VARIABLE} on ROCm",
                logging.getLogger("engram_client.integrations.vllm"))
_process = ProcessClient(ENGINE)


def rank_client(head_start: int, part_heads: int) -> RankClient:
    """This process's client, built on first use for vLLM's split ``(head_start, part_heads)``."""
    return _process.get(head_start, part_heads)
