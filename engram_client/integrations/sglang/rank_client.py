"""One EngramClient per SGLang TP rank process, registering only the rows of this rank's hash columns.

SGLang 0.5.23 shards each Engram layer over its TP group with ``shard_range``: when the TP
size divides the layer's hash columns (heads, in engramd's words) a rank owns whole columns,
``cols_per_rank`` of them from ``tp_rank * cols_per_rank``; otherwise it splits the rows
evenly, cutting through columns.  engramd registers whole heads, so the plugin serves the first
split and refuses the second, naming both numbers.  As in the vLLM plugin (whose RankClient
and ``head_rows`` this reuses), the first layer SGLang builds attaches the client for every
layer the daemon serves with that split; each later layer checks that its own rows are the
registered ones.
"""
from __future__ import annotations

import logging
import threading

import torch

from engram_client import DaemonUnavailableError, EngramClient, IntegrationError
from engram_client.attach.connection import DaemonConnection
from engram_client.attach.daemon_probe import absent_reason
from engram_client.attach.readiness import wait_ready
from engram_client.integrations.vllm.rank_client import RankClient, head_rows
from engram_client.integrations.vllm.settings import REACH_TIMEOUT_S, READY_TIMEOUT_S

from .settings import SWITCH_OFF

log = logging.getLogger("engram_client.integrations.sglang")

_lock = threading.Lock()
_current: RankClient | None = None


def column_split(n_columns: int, tp_rank: int, tp_size: int) -> tuple[int, int]:
    """(first column, columns per rank) of ``tp_rank``, as SGLang's ``shard_range`` splits on columns."""
    if n_columns % tp_size:
        raise IntegrationError(f"SGLang's TP size {tp_size} does not divide an Engram layer's {n_columns} hash "
                               "columns, so SGLang would split the layer's rows through its columns, and engramd "
                               "registers whole columns per rank: run a TP size that divides "
                               f"{n_columns}. {SWITCH_OFF}")
    per_rank = n_columns // tp_size
    return tp_rank * per_rank, per_rank


def lookup_device() -> torch.device:
    """The rank's CUDA device (SGLang sets it per scheduler process), or the CPU where there is none."""
    if torch.version.hip is not None:
        raise IntegrationError(f"engramd's GPU lookups are CUDA-only (cudaHostRegister); this torch is built for "
                               f"ROCm {torch.version.hip}. {SWITCH_OFF}")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def rank_client(head_start: int, part_heads: int) -> RankClient:
    """This process's client, attached on first use for the split ``(head_start, part_heads)``."""
    global _current
    with _lock:
        if _current is None:
            _current = _attach(head_start, part_heads)
        elif (_current.head_start, _current.part_heads) != (head_start, part_heads):
            raise IntegrationError(f"this rank registered Engram columns from {_current.head_start} "
                                   f"({_current.part_heads} per rank) and SGLang now asks for columns from "
                                   f"{head_start} ({part_heads} per rank): one process serves one TP split")
        return _current


def _attach(head_start: int, part_heads: int) -> RankClient:
    connection = DaemonConnection(None)  # $ENGRAMD_SOCKET, else the default path
    advice = "start engramd before SGLang (engramd serve --checkpoint DIR), or set ENGRAMD_SOCKET to its socket"
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
    wanted = {int(entry["layer"]): tuple(entry["head_sizes"]) for entry in status["layers"]}
    if {layer: client.table(layer).head_sizes for layer in client.layers} != wanted:
        client.close()
        raise IntegrationError(f"engramd's table changed while this rank attached ({attached.describe_table()} "
                               "before; a reload?): start the model again")
    log.info("attached to %s: layers %s, rows %s", attached.describe_table(), client.layers, row_ranges)
    return attached
