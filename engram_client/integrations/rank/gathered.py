"""One error for every rank of an engine's group: each rank's failure, gathered, raised by all.

vLLM builds a DP-shared table collectively (its own storage all-gathers errors the same way),
and an engine's ranks then meet in collectives (SGLang's TP group in its first all-reduce); a
rank that raised alone would leave the others waiting there.  So a step that can fail on some
ranks ends with ``raise_gathered`` on all of them: the same IntegrationError everywhere, naming
each failing rank (ranks that failed alike once).  The gather waits for every rank of the
group, as vLLM's own does, bounded by the group's timeout (the engine's, for its gloo
``cpu_group``); a rank that died makes it raise there.
"""
from __future__ import annotations

import torch

from engram_client import IntegrationError


def raise_gathered(group, error: BaseException | None, what: str) -> None:
    """``group``: the engine's GroupCoordinator (``world_size``, ``cpu_group``: a gloo group), vLLM's or SGLang's."""
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    message = None if error is None else str(error) if isinstance(error, IntegrationError) else \
        f"{type(error).__name__}: {error}"
    gathered: list = [None] * group.world_size
    torch.distributed.all_gather_object(gathered, (rank, message), group=group.cpu_group)
    by_text: dict[str, list[int]] = {}
    for failed, text in gathered:
        if text is not None:
            by_text.setdefault(text, []).append(failed)
    if by_text:
        raise IntegrationError(f"{what}: " + "; ".join(
            f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {text}"
            for text, ranks in by_text.items())) from error
