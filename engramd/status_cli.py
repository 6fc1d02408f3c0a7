"""`engramd status`: a readiness probe for scripts and a report for people.

Exit 0 iff the table is ready, 1 if the daemon answers but is not ready, 3 if no
daemon answers.  ``--json`` always prints one JSON object on stdout, also when no
daemon answers (``{"state": "absent" | "unreachable", "endpoint", "error"}``), so a
probe can parse every outcome.  ``--wait`` polls until ready (or failed, which never
turns ready by itself) and, on a terminal, shows what it is waiting for.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

import click

from engram_client.connection import DaemonConnection
from engram_client.errors import DaemonUnavailableError, EngramError
from engram_client.protocol import default_endpoint

from . import reach
from .cli_errors import EXIT_NOT_READY, EXIT_UNREACHABLE, fail
from .progress import render
from .status_text import render_status

POLL_S = 0.2


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
    if reply["state"] == "loading":
        return f"generation {reply['generation']}: " + render(reply["load"]["done_bytes"], reply["load"]["total_bytes"])
    if pending and pending.get("state") == "loading":
        return f"reload to generation {pending['generation']}: " + render(pending["load"]["done_bytes"],
                                                                         pending["load"]["total_bytes"])
    return f"waiting {waited:.0f} s: state {reply['state']}"


def poll_status(endpoint: str, curve_keys_dir: str | None, wait_s: float, display: WaitDisplay) -> dict[str, Any]:
    """The daemon's status once it is ready or failed, or when ``wait_s`` is over."""
    started = time.monotonic()
    deadline = started + wait_s
    connection: DaemonConnection | None = None
    try:
        while True:
            reply, problem, asked = None, None, False
            try:
                if connection is None:
                    connection = reach.connect(endpoint, curve_keys_dir=curve_keys_dir)
                timeout = max(0.5, min(2.0, deadline - time.monotonic()))
                asked = True
                reply = connection.request("status", timeout=timeout)
            except DaemonUnavailableError as exc:
                problem = exc
                if connection is not None:
                    connection.close()
                    connection = None
            waited = time.monotonic() - started
            if reply is not None and (reply["state"] in ("ready", "failed") or waited >= wait_s):
                return reply
            if reply is None and waited >= wait_s:
                if isinstance(problem, reach.DaemonAbsentError):
                    raise reach.DaemonAbsentError(endpoint, problem.reason + (f" (waited {waited:.1f} s)"
                                                                              if wait_s else ""))
                if not asked:  # refused before asking (permission denied): that message says it all
                    raise problem
                raise reach.unanswered(endpoint, "status", waited) from problem
            display.show(_waiting_text(reply, problem, waited))
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
    finally:
        display.end()
        if connection is not None:
            connection.close()


@click.command()
@click.option("--socket", "endpoint", default=None, metavar="ENDPOINT",
              help="Daemon endpoint [default: $ENGRAMD_SOCKET or a per-user ipc:// path].")
@click.option("--json", "as_json", is_flag=True, help="Print the status object as JSON (always one object).")
@click.option("--curve-keys-dir", default=None, type=click.Path(file_okay=False),
              help="For a tcp:// socket: use DIR/client.key_secret and trust DIR/server.key.")
@click.option("--wait", "wait_s", default=0.0, type=float, metavar="SECONDS",
              help="Wait up to this long for the table to be ready (progress shown on a terminal).")
def status(endpoint: str | None, as_json: bool, curve_keys_dir: str | None, wait_s: float) -> None:
    """Print the daemon's status; exit 0 iff its table is ready (1 not ready, 3 no daemon)."""
    endpoint = endpoint or default_endpoint()
    display = WaitDisplay(sys.stderr, enabled=wait_s > 0 and sys.stderr.isatty())
    try:
        reply = poll_status(endpoint, curve_keys_dir, wait_s, display)
    except EngramError as exc:
        if as_json:
            state = "absent" if isinstance(exc, reach.DaemonAbsentError) else \
                "unreachable" if isinstance(exc, DaemonUnavailableError) else "error"
            click.echo(json.dumps({"state": state, "endpoint": endpoint, "error": str(exc)}, indent=2))
        fail(str(exc), EXIT_UNREACHABLE if isinstance(exc, DaemonUnavailableError) else 1)
    if as_json:
        click.echo(json.dumps(reply, indent=2, sort_keys=True))
    else:
        for line in render_status(reply):
            click.echo(line)
    sys.exit(0 if reply["state"] == "ready" else EXIT_NOT_READY)
