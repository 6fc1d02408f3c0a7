"""Wire protocol between engramd and its clients: framing, envelopes, versions.

The normative description is docs/protocol.md; this module is its code.  It is
versioned apart from the packages: a different major version is refused, a higher
minor version only adds fields, which readers ignore.

    request   {"v": "1.0", "id": <int|str>, "op": <str>, "args": {..}}
    reply ok  {"v": "1.0", "id": <echoed>, "ok": true,  "result": {..}}
    reply err {"v": "1.0", "id": <echoed|null>, "ok": false,
               "error": {"code": <str>, "name": <str>, "message": <str>}}
    event     {"v": "1.0", "event": "state", "state": .., "generation": .., "boot_id": ..}

One msgpack map per ZeroMQ frame (``raw=False``, never pickle).  Requests go to a
ROUTER socket; a client may use DEALER (frames: [payload]) or REQ (frames: ["",
payload]); replies mirror the framing they came with.  Events go out on a PUB
socket whose endpoint the status reply names; polling ``status`` is always enough
to learn readiness.

This module is the one source of the operation names and the state names.  Where
a daemon listens is endpoints.py's business.  This module must not import zmq's
socket machinery or torch: the daemon, the CLI and the client all import it.
"""
from __future__ import annotations

import re
from typing import Any

import msgpack

from .errors import ProtocolError

# 1.1 added reload and generation fields; 1.2 the status hashing field, lease secrets,
# clients_total and the per-peer bounds; 1.3 the node's gather budget (attach, heartbeat, status);
# 1.4 the hot-row list (attach, status), the HBM row cache's counters (heartbeat, status) and NUMA
# replicas (attach's numa_node and replicas, status.replicas, clients[].numa_node and replica);
# 1.5 the gather budget's prefill rule (its header's flags, status, heartbeat's prefill_threads);
# 1.6 heartbeat's stand_ins (decode-size calls gathered in place of a crew thread off its CPU);
# 1.7 the gather budget's decode CPUs (its header's decode counts, status's decode_tokens and decode_cpus);
# 1.8 quiet spares (the header's flags bit 2, the groups' decode_at, status's decode_spares "quiet");
# 1.9 heartbeat's spare_blocks and spare_asides (what a client's spares gathered, and how often they stood aside)
# 1.10 heartbeat's decode_fifo (the SCHED_FIFO priority a client's workers gather decode-size calls at)
PROTOCOL_VERSION = (1, 10)
VERSION_STRING = f"{PROTOCOL_VERSION[0]}.{PROTOCOL_VERSION[1]}"
# A request larger than this is refused by the socket itself (ZMQ_MAXMSGSIZE):
# every legitimate request is a few hundred bytes.
MAX_REQUEST_BYTES = 64 * 1024
# Replies are bounded apart: status summarizes its client list and stays far below this,
# which only guards a client against a runaway (or hostile) peer.
MAX_REPLY_BYTES = 16 * 1024 * 1024
_VERSION = re.compile(r"([0-9]{1,6})\.([0-9]{1,6})")
OPERATIONS = ("attach", "heartbeat", "detach", "status", "stop", "reload")
# The daemon's states as status replies and state events name them (docs/protocol.md).
LOADING, READY, FAILED, STOPPING = "loading", "ready", "failed", "stopping"
STATES = (LOADING, READY, FAILED, STOPPING)


def pack(message: dict[str, Any]) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def unpack(frame: bytes, limit: int = MAX_REQUEST_BYTES) -> Any:
    """Decode one frame of at most ``limit`` bytes; anything that is not a msgpack map raises ProtocolError."""
    if len(frame) > limit:
        raise ProtocolError(f"message of {len(frame)} bytes exceeds the {limit}-byte limit")
    try:
        message = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise ProtocolError(f"frame is not valid msgpack: {exc}") from exc
    if not isinstance(message, dict):
        raise ProtocolError(f"message must be a map, got {type(message).__name__}")
    return message


def check_version(message: dict[str, Any]) -> tuple[int, int]:
    """The message's (major, minor), once it is known compatible; ProtocolError otherwise."""
    version = message.get("v")
    if not isinstance(version, str):
        raise ProtocolError(f"message lacks a protocol version string 'v' (this side speaks {VERSION_STRING})")
    match = _VERSION.fullmatch(version)
    if match is None:  # ASCII digits only, and short: int() of anything else is trouble
        raise ProtocolError(f"protocol version {version[:32]!r} is not MAJOR.MINOR")
    major = match.group(1)
    if int(major) != PROTOCOL_VERSION[0]:
        raise ProtocolError(f"protocol version {version} is not compatible with {VERSION_STRING} (major differs)")
    return int(major), int(match.group(2))


def request(op: str, request_id: int | str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"v": VERSION_STRING, "id": request_id, "op": op, "args": args or {}}


def parse_request(message: dict[str, Any]) -> tuple[Any, str, dict[str, Any]]:
    """Validate a decoded request; returns (id, op, args) or raises ProtocolError."""
    check_version(message)
    request_id = message.get("id")
    if not isinstance(request_id, (int, str)) or isinstance(request_id, bool):
        raise ProtocolError("request 'id' must be an integer or a string")
    op = message.get("op")
    if not isinstance(op, str):
        raise ProtocolError("request 'op' must be a string")
    if op not in OPERATIONS:
        raise ProtocolError(f"unknown operation {op!r}; known: {', '.join(OPERATIONS)}")
    args = message.get("args", {})
    if not isinstance(args, dict):
        raise ProtocolError(f"request 'args' must be a map, got {type(args).__name__}")
    return request_id, op, args


def ok_reply(request_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"v": VERSION_STRING, "id": request_id, "ok": True, "result": result}


def error_reply(request_id: Any, code: str, name: str, message: str) -> dict[str, Any]:
    return {"v": VERSION_STRING, "id": request_id, "ok": False,
            "error": {"code": code, "name": name, "message": message}}


def state_event(state: str, generation: int, boot_id: str) -> dict[str, Any]:
    return {"v": VERSION_STRING, "event": "state", "state": state, "generation": generation, "boot_id": boot_id}
