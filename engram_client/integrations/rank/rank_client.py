"""One EngramClient per engine rank process, registering only the rows of this rank's hash columns.

The client has to know every layer's row range when it is built, but an engine builds one
layer's embedding at a time; so the first embedding attaches the client for every layer the
daemon serves, with that embedding's split of the layer's heads (one split for all layers: they
share the head count), and each later embedding checks that its own rows are the registered ones.
How an engine splits its heads over TP ranks is the engine's (its plugin's rank_client.py).

No daemon at the endpoint (no socket file, or a stale one) is reported at once, one that answers
nothing within REACH_TIMEOUT_S after that; one that answers but is still loading is waited for,
up to READY_TIMEOUT_S.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

import torch

from engram_client import DaemonUnavailableError, EngramClient, IntegrationError
from engram_client.attach.connection import DaemonConnection
from engram_client.attach.daemon_probe import absent_reason
from engram_client.attach.readiness import wait_ready
from engram_client.core.variables import DECODE_PATH, DECODE_PRIORITY
from engram_client.lookup.config import DECODE_PRIORITIES

# A daemon that answers nothing within this is reported at once (not started, wrong socket)...
REACH_TIMEOUT_S = 10.0
# ...one that answers but is still loading is waited for: V4.1's ~200 GB table takes minutes.
READY_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Engine:
    """An engine as a rank's messages name it."""
    name: str  # "vLLM", "SGLang"
    columns: str  # what the engine calls a layer's hash columns: "heads", "columns"
    on_rocm: str  # how the refusal of a ROCm torch ends: what the user should do
    log: logging.Logger


@dataclass(frozen=True)
class RankClient:
    client: EngramClient
    status: dict[str, Any]  # the daemon's status when the client attached: what errors name
    head_start: int
    part_heads: int  # the engine's heads per rank (vLLM's part_n_hash_cols counts padded heads)
    engine: str  # the engine that attached it, as errors name it

    def describe_table(self) -> str:
        status = self.status
        return (f"engramd at {self.client.endpoint} serving checkpoint "
                f"{status.get('checkpoint')} (fingerprint {status.get('fingerprint')}, generation "
                f"{status.get('generation')})")


def head_rows(head_sizes: tuple[int, ...], head_start: int, part_heads: int) -> tuple[int, int]:
    """Rows of heads [head_start, head_start + part_heads) (clipped to the heads there are)."""
    return sum(head_sizes[:head_start]), sum(head_sizes[:head_start + part_heads])


def lookup_device(engine: Engine) -> torch.device:
    """The rank's current CUDA device (the engine sets it per rank process), or the CPU where there is none."""
    if torch.version.hip is not None:
        raise IntegrationError("engramd's GPU lookups are CUDA-only (cudaHostRegister); this torch is built for "
                               f"ROCm {torch.version.hip}{engine.on_rocm}")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class ProcessClient:
    """The one RankClient of this process for ``engine``: attached on first use, then checked."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._current: RankClient | None = None

    def get(self, head_start: int, part_heads: int) -> RankClient:
        """This process's client, attached on first use for the split ``(head_start, part_heads)``."""
        engine = self.engine
        with self._lock:
            if self._current is None:
                self._current = _attach(engine, head_start, part_heads)
            elif (self._current.head_start, self._current.part_heads) != (head_start, part_heads):
                raise IntegrationError(f"this rank registered Engram {engine.columns} from "
                                       f"{self._current.head_start} ({self._current.part_heads} per rank) and "
                                       f"{engine.name} now asks for {engine.columns} from {head_start} "
                                       f"({part_heads} per rank): one process serves one TP split")
            return self._current


def decode_path_asked() -> str | None:
    """$ENGRAMD_DECODE_PATH, the engine's choice of its decode-size calls' path (docs/integration.md,
    "Decode lookups on the GPU"): None (unset, empty: as every other call), "host" or "uva"; anything
    else is refused."""
    value = os.environ.get(DECODE_PATH, "").strip()
    if value in ("host", "uva"):
        return value
    if value:
        raise IntegrationError(f"{DECODE_PATH}={value!r}: set it to uva (decode-size lookups by the GPU "
                               "kernel, no CPU) or host, or unset it")
    return None


def decode_priority_asked() -> str:
    """$ENGRAMD_DECODE_PRIORITY, the engine's choice of its host-path workers' priority for decode-size
    calls (docs/integration.md, "Decode workers at SCHED_FIFO"): "normal" (unset, empty) or "fifo";
    anything else is refused."""
    value = os.environ.get(DECODE_PRIORITY, "").strip() or "normal"
    if value not in DECODE_PRIORITIES:
        raise IntegrationError(f"{DECODE_PRIORITY}={value!r}: set it to fifo (decode-size gathers at SCHED_FIFO, "
                               "which the engine must be allowed) or normal, or unset it")
    return value


def _attach(engine: Engine, head_start: int, part_heads: int) -> RankClient:
    decode_path = decode_path_asked()  # before anything is reached: a typo is the user's first error
    decode_priority = decode_priority_asked()
    connection = DaemonConnection(None)  # $ENGRAMD_SOCKET, else the default path
    advice = (f"start engramd before {engine.name} (engramd serve --checkpoint DIR), or set ENGRAMD_SOCKET "
              "to its socket")
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
    client = EngramClient(endpoint=connection.endpoint, device=lookup_device(engine), timeout=READY_TIMEOUT_S,
                          row_ranges=row_ranges, rank=rank, decode_path=decode_path, decode_priority=decode_priority)
    attached = RankClient(client, status, head_start, part_heads, engine.name)
    served = {layer: client.table(layer).head_sizes for layer in client.layers}
    wanted = {int(entry["layer"]): tuple(entry["head_sizes"]) for entry in status["layers"]}
    if served != wanted:
        client.close()
        raise IntegrationError(f"engramd's table changed while this rank attached ({attached.describe_table()} "
                               "before; a reload?): start the model again")
    engine.log.info("attached to %s: layers %s, rows %s%s", attached.describe_table(), client.layers, row_ranges,
                    (f"; decode-size lookups on the {decode_path} path ({DECODE_PATH})" if decode_path else "")
                    + (f"; decode-size gathers at SCHED_FIFO ({DECODE_PRIORITY})" if decode_priority == "fifo" else ""))
    return attached
