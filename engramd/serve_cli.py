"""`engramd serve`: settings from flags, ENGRAMD_* variables and a TOML file, then the server."""
from __future__ import annotations

import sys

import click

from engram_client.core.errors import EngramError

from .settings import SETTINGS, config_option, describe, serve_config


def _with_settings(fn):
    for setting in reversed(SETTINGS):
        fn = setting.option()(fn)
    return fn


@click.command()
@config_option()
@_with_settings
@click.option("--print-config", is_flag=True, help="Print the effective settings and where each came from; exit.")
@click.pass_context
def serve(ctx: click.Context, config_file, print_config, **values) -> None:
    """Load the table into the shm dir and serve it until stopped.

    Each setting comes from, highest first: its flag, its ENGRAMD_* environment variable,
    the TOML file (--config or $ENGRAMD_CONFIG), the default."""
    from .logs import setup_logging
    from .server import Server

    if print_config:
        click.echo(describe(ctx, values))
        return
    setup_logging(values["log_level"], values["log_format"])
    try:
        config = serve_config(values)
        server = Server(config)
    except EngramError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    sys.exit(server.serve_forever())
