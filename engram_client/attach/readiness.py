"""Waiting for a daemon's table to be served: the one poll loop the client, the CLI and the demo share.

Polling ``status`` is always enough to learn readiness (docs/protocol.md), so this
needs no events socket.  Torch-free: the CLI imports it.
"""
from __future__ import annotations

import subprocess
import time
from typing import Any, Callable

from .connection import DaemonConnection
from .daemon_probe import MISSING, absent_reason
from ..core.errors import DaemonUnavailableError, EngramError, EngramTimeoutError, NotReadyError
from ..core.protocol import FAILED, READY

POLL_S = 0.1


def _served(status: dict[str, Any], generation: int | None) -> bool:
    return status["state"] == READY and (generation is None or status["generation"] == generation)


def _failure(status: dict[str, Any], generation: int | None) -> str | None:
    """The error of the awaited generation if it failed, else None."""
    if generation is None:
        return (status.get("error") or "unknown error") if status["state"] == FAILED else None
    pending = status.get("reload")
    for candidate in (pending, status):
        if candidate and candidate["generation"] == generation and candidate["state"] == FAILED:
            return candidate.get("error") or "unknown error"
    return None


def refuse_missing_socket(endpoint: str) -> None:
    """DaemonUnavailableError at once if no socket file is at ``endpoint``'s path: a rank's client says it
    as the command line does, instead of waiting its whole timeout for a daemon nobody started."""
    if absent_reason(endpoint, probe=False) == MISSING:
        raise DaemonUnavailableError(f"no engramd at {endpoint}: {MISSING} (start engramd first, or point "
                                     "ENGRAMD_SOCKET or endpoint= at its socket)")


OnPoll = Callable[[dict[str, Any] | None, DaemonUnavailableError | None], None]


def wait_ready(connection: DaemonConnection, timeout: float, generation: int | None = None,
               daemon: subprocess.Popen | None = None, request_timeout: float = 2.0,
               on_poll: OnPoll | None = None) -> dict[str, Any]:
    """Poll status until the table (or ``generation``, after a reload) is served; return that status.

    Raises NotReadyError once the awaited load has failed, EngramTimeoutError when ``timeout``
    runs out (both with ``.status``, the last reply or None if none came, and ``.unavailable``,
    the last DaemonUnavailableError or None), and
    DaemonUnavailableError if ``daemon``, the process serving it, exits first.  At least one
    status request is made, even with ``timeout`` 0 (then bounded by ``request_timeout`` alone);
    otherwise ``timeout`` is a deadline: each request waits up to ``request_timeout`` for its
    answer, and none past the deadline.  ``on_poll(status, unavailable)`` sees each unfinished
    poll before the pause that follows it (``engramd status --wait`` shows it)."""
    deadline = time.monotonic() + timeout
    status = unavailable = None
    first = True
    while True:
        if daemon is not None and daemon.poll() is not None:
            raise DaemonUnavailableError(f"engramd exited with code {daemon.returncode} before its table was ready")
        remaining = deadline - time.monotonic()
        if remaining <= 0 and not first:
            raise _with_status(EngramTimeoutError(_timeout_message(connection, timeout, generation, status)),
                               status, unavailable)
        try:
            status = connection.request("status", timeout=request_timeout if first and remaining <= 0
                                        else min(request_timeout, remaining))
            unavailable = None
        except DaemonUnavailableError as exc:
            unavailable = exc
        if status is not None:
            if _served(status, generation):
                return status
            error = _failure(status, generation)
            if error is not None:
                what = "its table" if generation is None else f"generation {generation}"
                raise _with_status(NotReadyError(f"engramd at {connection.endpoint} failed to load {what}: "
                                                   f"{error}"), status, unavailable)
        first = False
        if on_poll is not None:
            on_poll(status, unavailable)
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))


def _timeout_message(connection: DaemonConnection, timeout: float, generation: int | None,
                     status: dict[str, Any] | None) -> str:
    detail = (absent_reason(connection.endpoint) or "no answer") if status is None else f"state {status.get('state')}, loaded " \
        f"{status['load']['done_bytes']}/{status['load']['total_bytes']} bytes"
    what = "a ready table" if generation is None else f"generation {generation} served"
    return f"waited {timeout:.1f} s for engramd at {connection.endpoint} to have {what} ({detail})"


def _with_status(error: EngramError, status: dict[str, Any] | None,
                 unavailable: DaemonUnavailableError | None) -> EngramError:
    error.status, error.unavailable = status, unavailable
    return error
