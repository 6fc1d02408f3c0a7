"""How the host path's CUDA stream and its gather workers signal each other, per device.

Two ways (engram_client/lookup/host/engine/signal.c draws the first):

- ``stream-memops``: the stream writes a word in pinned memory when the ids are there
  (``cuStreamWriteValue32``), a polling worker sees it within microseconds, the workers write
  the count of staged chunks and each chunk's copy waits for it (``cuStreamWaitValue32``).
  No host function; the same calls captured in a CUDA graph replay as they are.
- ``host-functions``: ``cuLaunchHostFunc`` per chunk; each runs ~35 us after the stream reaches
  it (measured on the H200 machine).  The fallback where the driver lacks the _v2 memory
  operations (older than CUDA 11.7) or the device fails a live round trip.

The choice is made once per device and process (``signalling_for``), logged once, and shown in
``EngramClient.lookup_path_info``.  ``ENGRAM_HOST_SIGNAL`` overrides it: ``auto`` (the default),
``stream-memops`` (refuse to start where it cannot work) or ``host-functions`` (force the fallback).
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field

import torch

from . import _host_gather
from ...core.errors import ConfigError, CudaRegistrationError

log = logging.getLogger("engram_client")
ENV = "ENGRAM_HOST_SIGNAL"
STREAM_MEMOPS, HOST_FUNCTIONS = "stream-memops", "host-functions"
REQUESTS = ("auto", STREAM_MEMOPS, HOST_FUNCTIONS)


@dataclass(frozen=True)
class SignalChoice:
    mode: str  # STREAM_MEMOPS or HOST_FUNCTIONS
    reason: str  # why, in words
    support: dict = field(default_factory=dict)  # stream_signal_support()'s answer, where it was asked

    def as_dict(self) -> dict:
        return {"signalling": self.mode, "reason": self.reason, "device_support": dict(self.support)}


_chosen: dict[tuple[int, str], SignalChoice] = {}
_lock = threading.Lock()


def requested() -> str:
    value = os.environ.get(ENV, "").strip() or "auto"
    if value not in REQUESTS:
        raise ConfigError(f"{ENV}={value!r}: use one of {', '.join(REQUESTS)}")
    return value


def signalling_for(device: torch.device) -> SignalChoice:
    """How the host path on ``device`` signals (asked of the device once per process)."""
    request = requested()
    key = (device.index, request)
    with _lock:
        choice = _chosen.get(key)
        if choice is None:
            choice = _chosen[key] = _choose(device, request)
            _say(device, request, choice)
    return choice


def _choose(device: torch.device, request: str) -> SignalChoice:
    if request == HOST_FUNCTIONS:
        return SignalChoice(HOST_FUNCTIONS, f"{ENV}={HOST_FUNCTIONS} asks for them")
    support = _probe(device)
    if support["supported"]:
        return SignalChoice(STREAM_MEMOPS, f"the device answered a live round trip in {support['round_trip_us']:.1f} us",
                            support)
    if request == STREAM_MEMOPS:
        raise CudaRegistrationError(f"{ENV}={STREAM_MEMOPS}, but {device} cannot signal with stream memory "
                                    f"operations: {support['reason']}")
    return SignalChoice(HOST_FUNCTIONS, f"stream memory operations are not usable here: {support['reason']}", support)


def _probe(device: torch.device) -> dict:
    """The device's answer to a live round trip (engine/signal_support.c), in its context."""
    with torch.cuda.device(device):
        torch.cuda.current_stream(device)
        return _host_gather.stream_signal_support()


def _say(device: torch.device, request: str, choice: SignalChoice) -> None:
    if choice.mode == STREAM_MEMOPS:
        log.info("host path on %s: stream memory operations signal the gather workers (%s)", device, choice.reason)
    elif request == HOST_FUNCTIONS:
        log.info("host path on %s: host functions signal the gather workers (%s)", device, choice.reason)
    else:
        log.warning("host path on %s falls back to host functions, ~35 us later per lookup than stream memory "
                    "operations: %s", device, choice.reason)
