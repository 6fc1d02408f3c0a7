"""`engramd status`: a readiness probe for scripts and a report for people.

Exit 0 iff the table is ready, 1 if the daemon answers but is not ready, 3 if no
daemon answers, 4 if this user may not (or must not) talk through the socket.
``--json`` always prints one JSON object on stdout, also when no daemon answers
(``{"state": "absent" | "unreachable" | "refused", "endpoint", "error"}``), so a probe
can parse every outcome.  Each request waits up to ``--timeout`` for its answer
(REQUEST_TIMEOUT_S, what the README and the probes count on).  ``--wait`` polls until
ready (or failed, which never turns ready by itself) and, on a terminal, shows what it
is waiting for; it is a deadline, which no request outlives.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

import click

from engram_client.attach.connection import DaemonConnection
from engram_client.core.endpoints import default_endpoint
from engram_client.core.errors import (DaemonUnavailableError, EngramError, EngramTimeoutError, NotReadyError,
                                       SocketRefusedError)
from engram_client.core.protocol import LOADING, READY
from engram_client.attach.readiness import wait_ready

from . import reach
from .error_map import EXIT_NOT_READY, exit_code_for, fail
from ..reporting.progress import render
from ..reporting.status_text import print_status

REQUEST_TIMEOUT_S = reach.ANSWER_TIMEOUT_S


class WaitDisplay:
    """One line on a terminal saying what ``--wait`` waits for; nothing elsewhere."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream, self.enabled, self._drawn = stream, enabled, False

    def show(self, text: str) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[K" + text)
            self.stream.flush()
            self._drawn = True

    def end(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


def _waiting_text(reply: dict[str, Any] | None, problem: Exception | None, waited: float) -> str:
    if reply is None:
        return f"waiting {waited:.0f} s: {problem}"
    pending = reply.get("reload")
    if reply["state"] == LOADING:
        return f"generation {reply['generation']}: " + render(reply["load"]["done_bytes"], reply["load"]["total_bytes"])
    if pending and pending.get("state") == LOADING:
        return f"reload to generation {pending['generation']}: " + render(pending["load"]["done_bytes"],
                                                                         pending["load"]["total_bytes"])
    return f"waiting {waited:.0f} s: state {reply['state']}"


def poll_status(endpoint: str, curve_keys_dir: str | None, wait_s: float, display: WaitDisplay,
                request_timeout: float = REQUEST_TIMEOUT_S) -> dict[str, Any]:
    """The daemon's status once it is ready or failed, or when ``wait_s`` is over (then the last
    reply, if the last poll had one).  Without ``--wait`` a missing or stale socket file is
    reported at once; with it, the daemon may still be starting, so it is asked until the end.
    A refused socket (SocketRefusedError) ends the wait at once: waiting cannot mend it."""
    started = time.monotonic()
    if wait_s:  # refused at once only where no poll could help (permission denied)
        connection = DaemonConnection(endpoint, curve_keys_dir=curve_keys_dir)
    else:
        connection = reach.connect(endpoint, curve_keys_dir=curve_keys_dir)

    def show(reply: dict[str, Any] | None, problem: DaemonUnavailableError | None) -> None:
        if isinstance(problem, SocketRefusedError):
            raise problem
        display.show(_waiting_text(reply, problem, time.monotonic() - started))

    try:
        return wait_ready(connection, wait_s, on_poll=show, request_timeout=request_timeout)
    except NotReadyError as exc:  # the load failed: its status says so
        if getattr(exc, "status", None) is None:
            raise
        return exc.status
    except EngramTimeoutError as exc:
        if exc.status is not None and exc.unavailable is None:
            return exc.status  # answered, but not ready yet
        if isinstance(exc.unavailable, SocketRefusedError):
            raise exc.unavailable from exc
        waited = time.monotonic() - started
        reason = reach.absent_reason(connection.endpoint)
        if reason is not None:
            raise reach.DaemonAbsentError(connection.endpoint, f"{reason} (waited {waited:.1f} s)") from exc
        raise reach.unanswered(connection.endpoint, "status", waited) from exc
    finally:
        display.end()
        connection.close()


@click.command()
@click.option("--socket", "endpoint", default=None, metavar="ENDPOINT",
              help="Daemon endpoint [default: $ENGRAMD_SOCKET or a per-user ipc:// path].")
@click.option("--json", "as_json", is_flag=True, help="Print the status object as JSON (always one object).")
@click.option("--curve-keys-dir", default=None, type=click.Path(file_okay=False),
              help="For a tcp:// socket: use DIR/client.key_secret and trust DIR/server.key.")
@reach.wait_option("Wait up to this long for the table to be ready (progress shown on a terminal); "
                   "no request outlives it.")
@click.option("--timeout", "request_timeout", default=REQUEST_TIMEOUT_S, show_default=True, type=float,
              metavar="SECONDS", help="Wait up to this long for each answer of the daemon.")
def status(endpoint: str | None, as_json: bool, curve_keys_dir: str | None, wait_s: float,
           request_timeout: float) -> None:
    """Print the daemon's status; exit 0 iff its table is ready (1 not ready, 3 no daemon, 4 refused)."""
    endpoint = endpoint or default_endpoint()
    if not request_timeout > 0:
        fail(f"--timeout must be positive, got {request_timeout}")
    display = WaitDisplay(sys.stderr, enabled=wait_s > 0 and sys.stderr.isatty())
    try:
        reply = poll_status(endpoint, curve_keys_dir, wait_s, display, request_timeout)
    except EngramError as exc:
        if as_json:
            state = "absent" if isinstance(exc, reach.DaemonAbsentError) else \
                "refused" if isinstance(exc, SocketRefusedError) else \
                "unreachable" if isinstance(exc, DaemonUnavailableError) else "error"
            click.echo(json.dumps({"state": state, "endpoint": endpoint, "error": str(exc)}, indent=2))
        fail(str(exc), exit_code_for(exc))
    if as_json:
        click.echo(json.dumps(reply, indent=2, sort_keys=True))
    else:
        print_status(reply)
    sys.exit(0 if reply["state"] == READY else EXIT_NOT_READY)
