"""A served Engram layer as one engine rank holds it, and a layer's heads in words for messages.

An engine's plugin picks the layer (the served one with exactly the engine's head sizes: sizes
are distinct primes, so at most one matches) and checks its rows against the engine's own shard
arithmetic; what it keeps is this record, which the lookups and the weight check read.
"""
from __future__ import annotations

from dataclasses import dataclass

from engram_client import EngramTable

from .rank_client import RankClient


@dataclass(frozen=True)
class ServedLayer:
    rank: RankClient
    table: EngramTable  # the layer's table, registered for this rank's rows only
    head_start: int  # the rank's first head, as the engine computed it
    local_heads: int  # heads the rank really has (vLLM pads part_n_hash_cols past the last head)
    model: str  # what the engine loads, as errors name it

    @property
    def layer(self) -> int:
        return self.table.layer


def heads_in_words(head_sizes: tuple[int, ...]) -> str:
    return f"{len(head_sizes)} heads of {min(head_sizes)}..{max(head_sizes)} rows ({sum(head_sizes)} in all)"
