"""`engramd serve`: settings from flags, ENGRAMD_* variables and a TOML file, then the server."""
from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any, Callable

import click

from engram_client.core.errors import EngramError

from .settings import SETTINGS, attributed, config_option, describe, serve_config

if TYPE_CHECKING:
    from ..daemon.config import ServeConfig

log = logging.getLogger("engramd")


def _with_settings(fn: Callable[..., None]) -> Callable[..., None]:
    for setting in reversed(SETTINGS):
        fn = setting.option()(fn)
    return fn


def _resolved(values: dict[str, Any], config: "ServeConfig", checkpoint: str | None) -> dict[str, Any]:
    """The settings whose value the daemon turns into something else (a default endpoint, an absolute
    path, the checkpoint it will serve)."""
    made = {"socket": config.endpoint, "events_socket": config.events_endpoint, "shm_dir": config.shm_dir,
            "checkpoint": checkpoint, "reload_root": list(config.reload_roots)}
    given = {name: list(value) if isinstance(value, tuple) else value for name, value in values.items()}
    return {name: value for name, value in made.items() if value not in (None, []) and value != given[name]}


def _print_config(ctx: click.Context, values: dict[str, Any]) -> None:
    from ..daemon.start_checkpoint import first_checkpoint
    from ..shm.fs_check import check_shm_dir

    try:
        config = serve_config(values)
        check_shm_dir(config.shm_dir, values["allow_disk"])
    except EngramError as exc:
        click.echo(describe(ctx, values))
        click.echo(f"# refused as it stands: {attributed(ctx, str(exc))}")
        return
    checkpoint, why = first_checkpoint(config)  # what a start now would serve: a recorded reload target wins
    click.echo(describe(ctx, values, _resolved(values, config, checkpoint), {"checkpoint": why} if why else None))


@click.command()
@config_option()
@_with_settings
@click.option("--print-config", is_flag=True, help="Print the effective settings and where each came from; exit.")
@click.pass_context
def serve(ctx: click.Context, config_file: str | None, print_config: bool, **values: Any) -> None:
    """Load the table into the shm dir and serve it until stopped.

    Each setting comes from, highest first: its flag, its ENGRAMD_* environment variable,
    the TOML file (--config or $ENGRAMD_CONFIG), the default."""
    from ..reporting.logs import setup_logging
    from ..daemon.server import Server
    from ..shm.fs_check import check_shm_dir

    if print_config:
        _print_config(ctx, values)
        return
    setup_logging(values["log_level"], values["log_format"])
    try:
        config = serve_config(values)
        shm = check_shm_dir(config.shm_dir, values["allow_disk"])
        server = Server(config)
    except EngramError as exc:
        click.echo(f"error: {attributed(ctx, str(exc))}", err=True)
        sys.exit(1)
    (log.info if shm.in_memory else log.warning)(shm.describe())
    sys.exit(server.serve_forever())
