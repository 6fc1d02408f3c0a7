"""`engramd stop`: ask the daemon to stop and return once its process is gone.

Exit 0 once the daemon's process has exited (daemon_exit.py says how that is known),
3 at once if no daemon is there, 1 if it is still running ``--timeout`` seconds after it
accepted the stop (the message names its pid), 4 if this user may not talk to it.
"""
from __future__ import annotations

import time

import click

from engram_client.core.endpoints import ipc_path

from . import reach
from .error_map import EXIT_UNREACHABLE, fail
from ..daemon.daemon_exit import LOAD_STOP_S, STOP_TIMEOUT_S, DaemonExit


@click.command()
@click.option("--socket", "endpoint", default=None, metavar="ENDPOINT",
              help="Daemon endpoint [default: $ENGRAMD_SOCKET or a per-user ipc:// path].")
@click.option("--timeout", default=STOP_TIMEOUT_S, show_default=True, type=float, metavar="SECONDS",
              help="Wait up to this long for the daemon's process to exit once it accepted the stop.")
def stop(endpoint: str | None, timeout: float) -> None:
    """Ask the daemon to stop; returns once its process is gone (at once if there is none)."""
    if not timeout >= 0:
        fail(f"--timeout must be 0 or more, got {timeout}")
    reach.local_only(endpoint, "stop")
    try:
        connection = reach.connect(endpoint)
    except reach.DaemonAbsentError as exc:
        fail(f"{exc}; nothing to stop", EXIT_UNREACHABLE)
    watch = None
    try:
        status = reach.ask(connection, "status", timeout=reach.ANSWER_TIMEOUT_S)
        path = ipc_path(connection.endpoint)
        if path is not None:
            watch = DaemonExit(path, status.get("pid"))  # before the stop, while the process surely runs
        reach.ask(connection, "stop", timeout=reach.ANSWER_TIMEOUT_S)
        started = time.monotonic()
        if watch is None or watch.wait(timeout):
            what = f" ({watch.gone()} after {time.monotonic() - started:.1f} s)" if watch else ""
            click.echo(f"engramd stopped{what}")
            return
        fail(f"engramd at {connection.endpoint} ({watch.describe()}) is still running "
             f"{time.monotonic() - started:.1f} s after it accepted the stop; a stopping daemon waits up to "
             f"{LOAD_STOP_S:.0f} s for a running load (see its log). Wait longer with --timeout")
    finally:
        if watch is not None:
            watch.close()
        connection.close()
