"""One EngramClient per vLLM rank process, registering only the rows of this rank's TP heads.

vLLM shards an Engram layer's heads over TP ranks: ``part_n_hash_cols = cdiv(heads, tp)`` heads
from ``head_start = tp_rank * part_n_hash_cols`` (the last rank may get fewer, vLLM pads the
rest with zeros), i.e. rows ``[vocab_start_idx, vocab_end_idx)`` of the layer.  The client has
to know every layer's range when it is built, but vLLM builds one layer's embedding at a time;
so the first embedding builds the client for every layer the daemon serves, with that
embedding's head split (one split for all layers: they share the head count), and each
embedding then checks that its own range is the one registered.

No daemon at the endpoint (no socket file, or a stale one) is reported at once, one that answers
nothing within REACH_TIMEOUT_S after that; one that answers but is still loading is waited for,
up to READY_TIMEOUT_S.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import torch

from engram_client import DaemonUnavailableError, EngramClient, IntegrationError
from engram_client.attach.connection import DaemonConnection
from engram_client.attach.daemon_probe import absent_reason
from engram_client.attach.readiness import wait_ready

from .settings import REACH_TIMEOUT_S, READY_TIMEOUT_S

log = logging.getLogger("engram_client.integrations.vllm")


@dataclass(frozen=True)
class RankClient:
    client: EngramClient
    status: dict[str, Any]  # the daemon's status when the client attached: what errors name
    head_start: int
    part_heads: int  # vLLM's part_n_hash_cols (padded heads included)

    def describe_table(self) -> str:
        status = self.status
        return (f"engramd at {self.client.endpoint} serving checkpoint "
                f"{status.get('checkpoint')} (fingerprint {status.get('fingerprint')}, generation "
                f"{status.get('generation')})")


_lock = threading.Lock()
_current: RankClient | None = None


def head_rows(head_sizes: tuple[int, ...], head_start: int, part_heads: int) -> tuple[int, int]:
    """Rows of heads [head_start, head_start + part_heads) (clipped to the heads there are)."""
    return sum(head_sizes[:head_start]), sum(head_sizes[:head_start + part_heads])


def lookup_device() -> torch.device:
    """The rank's current CUDA device (vLLM sets it per worker), or the CPU where there is none."""
    if torch.version.hip is not None:
        raise IntegrationError("engramd's GPU lookups are CUDA-only (cudaHostRegister); this torch is built for "
                               f"ROCm {torch.version.hip}: unset ENGRAMD_VLLM on ROCm")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def rank_client(head_start: int, part_heads: int) -> RankClient:
    """This process's client, built on first use for the split ``(head_start, part_heads)``."""
    global _current
    with _lock:
        if _current is None:
            _current = _attach(head_start, part_heads)
        elif (_current.head_start, _current.part_heads) != (head_start, part_heads):
            raise IntegrationError(f"this rank registered Engram heads from {_current.head_start} "
                                   f"({_current.part_heads} per rank) and vLLM now asks for heads from {head_start} "
                                   f"({part_heads} per rank): one process serves one TP split")
        return _current


def _attach(head_start: int, part_heads: int) -> RankClient:
    connection = DaemonConnection(None)  # $ENGRAMD_SOCKET, else the default path
    advice = "start engramd before vLLM (engramd serve --checkpoint DIR), or set ENGRAMD_SOCKET to its socket"
    try:
        reason = absent_reason(connection.endpoint)
        if reason is not None:
            raise IntegrationError(f"no engramd at {connection.endpoint}: {reason}: {advice}")
        try:
            connection.request("status", timeout=REACH_TIMEOUT_S)
        except DaemonUnavailableError as exc:
            raise IntegrationError(f"engramd at {connection.endpoint} did not answer within {REACH_TIMEOUT_S:.0f} s "
                                   f"({exc}): {advice}") from exc
        status = wait_ready(connection, READY_TIMEOUT_S)
    finally:
        connection.close()
    row_ranges = {int(entry["layer"]): head_rows(tuple(entry["head_sizes"]), head_start, part_heads)
                  for entry in status["layers"]}
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else None
    client = EngramClient(endpoint=connection.endpoint, device=lookup_device(), timeout=READY_TIMEOUT_S,
                          row_ranges=row_ranges, rank=rank)
    attached = RankClient(client, status, head_start, part_heads)
    served = {layer: client.table(layer).head_sizes for layer in client.layers}
    wanted = {int(entry["layer"]): tuple(entry["head_sizes"]) for entry in status["layers"]}
    if served != wanted:
        client.close()
        raise IntegrationError(f"engramd's table changed while this rank attached ({attached.describe_table()} "
                               "before; a reload?): start the model again")
    log.info("attached to %s: layers %s, rows %s", attached.describe_table(), client.layers, row_ranges)
    return attached

