"""Reaching the daemon from the command line: know at once when nobody is there.

A ZeroMQ connect to an ipc:// path that nothing listens on succeeds and then waits,
so "no daemon" would only show up as a timeout.  Before asking, the command line
looks at the socket file itself:

    no file at the path                       -> "socket file missing"            (at once)
    a file that is not a socket               -> "... is not a socket"            (at once)
    a socket nothing accepts on (ECONNREFUSED) -> "socket file is stale"          (at once)
    a listening socket                        -> ask, and report the time really waited

tcp:// endpoints cannot be looked at this way and are always asked.  The look itself is
engram_client.daemon_probe's (ranks use it too); this module says what the command line makes of it.
"""
from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

import click

from engram_client.attach.connection import DaemonConnection
from engram_client.core.errors import DaemonUnavailableError
from engram_client.core.endpoints import default_endpoint, ipc_path
from engram_client.attach.daemon_probe import absent_reason

F = TypeVar("F", bound=Callable[..., Any])  # the command a click option decorates

ANSWER_TIMEOUT_S = 10.0  # how long `status` and `stop` wait for an answer by default (README, probes)


def wait_option(help_text: str) -> Callable[[F], F]:
    """``--wait SECONDS`` (``wait_s``, default 0: no wait) for every command that waits for the daemon to be
    ready; a wait is a deadline, so a negative one is a usage error, the same for each command."""
    return click.option("--wait", "wait_s", default=0.0, type=click.FloatRange(min=0), metavar="SECONDS",
                        help=help_text)


class DaemonAbsentError(DaemonUnavailableError):
    """No daemon can be at the endpoint; known without waiting for an answer."""

    def __init__(self, endpoint: str, reason: str) -> None:
        super().__init__(f"no engramd at {endpoint}: {reason}")
        self.endpoint = endpoint
        self.reason = reason


def local_only(endpoint: str | None, command: str) -> None:
    """A usage error for ``command`` (stop, reload) given a tcp:// endpoint: over TCP the daemon
    answers status only (--remote-status), so no keys directory would make it work."""
    endpoint = endpoint or default_endpoint()
    if endpoint.startswith("tcp://"):
        raise click.UsageError(f"{endpoint}: over TCP engramd serves status only (--remote-status); {command} goes "
                               "through the daemon's ipc:// socket, on its node (--socket ipc:///path)")


def connect(endpoint: str | None, curve_keys_dir: str | None = None) -> DaemonConnection:
    """A connection to a daemon that may be there; DaemonAbsentError at once if none can be."""
    connection = DaemonConnection(endpoint, curve_keys_dir=curve_keys_dir)
    reason = absent_reason(connection.endpoint)
    if reason is not None:
        connection.close()
        raise DaemonAbsentError(connection.endpoint, reason)
    return connection


def ask(connection: DaemonConnection, op: str, args: dict[str, Any] | None = None,
        timeout: float = 5.0) -> dict[str, Any]:
    """One request; an unanswered one says how long it really waited, and for what."""
    started = time.monotonic()
    try:
        return connection.request(op, args, timeout=timeout)
    except DaemonUnavailableError as exc:
        raise unanswered(connection.endpoint, op, time.monotonic() - started) from exc


def unanswered(endpoint: str, op: str, waited_s: float) -> DaemonUnavailableError:
    reason = absent_reason(endpoint)
    if reason is not None:  # it went away while we waited
        return DaemonAbsentError(endpoint, f"{reason} (after waiting {waited_s:.1f} s)")
    if ipc_path(endpoint) is None:  # tcp://: silence is all a CURVE socket shows, whatever the cause
        why = ("is a daemon serving --remote-status at that address, and are these keys among those "
               "its --curve-keys-dir authorizes?")
    else:
        why = "its socket file is there, but nothing answered: is the daemon hung or overloaded?"
    return DaemonUnavailableError(f"engramd at {endpoint} did not answer {op!r} within {waited_s:.1f} s ({why})")
