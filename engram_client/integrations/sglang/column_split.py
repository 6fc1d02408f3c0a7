"""One EngramClient per SGLang TP rank process, registering only the rows of this rank's hash columns.

SGLang 0.5.23 shards each Engram layer over its TP group with ``shard_range``: when the TP
size divides the layer's hash columns (heads, in engramd's words) a rank owns whole columns,
``cols_per_rank`` of them from ``tp_rank * cols_per_rank``; otherwise it splits the rows
evenly, cutting through columns.  engramd registers whole heads, so the plugin serves the first
split and refuses the second, naming both numbers.  The first layer SGLang builds attaches the
process's client with that split (integrations/rank/rank_client.py, as for vLLM).
"""
from __future__ import annotations

import logging

from engram_client import IntegrationError
from engram_client.integrations.rank.rank_client import Engine, ProcessClient, RankClient

from .settings import SWITCH_OFF

ENGINE = Engine("SGLang", "columns", f". {SWITCH_OFF}", logging.getLogger("engram_client.integrations.sglang"))
_process = ProcessClient(ENGINE)


def column_split(n_columns: int, tp_rank: int, tp_size: int) -> tuple[int, int]:
    """(first column, columns per rank) of ``tp_rank``, as SGLang's ``shard_range`` splits on columns."""
    if n_columns % tp_size:
        raise IntegrationError(f"SGLang's TP size {tp_size} does not divide an Engram layer's {n_columns} hash "
                               "columns, so SGLang would split the layer's rows through its columns, and engramd "
                               "registers whole columns per rank: run a TP size that divides "
                               f"{n_columns}. {SWITCH_OFF}")
    per_rank = n_columns // tp_size
    return tp_rank * per_rank, per_rank


def rank_client(head_start: int, part_heads: int) -> RankClient:
    """This process's client, attached on first use for the split ``(head_start, part_heads)``."""
    return _process.get(head_start, part_heads)
