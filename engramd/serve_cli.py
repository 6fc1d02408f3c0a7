"""`engramd serve`: settings from flags, ENGRAMD_* variables and a TOML file, then the server."""
from __future__ import annotations

import sys

import click

from engram_client.core.errors import EngramError

from .settings import SETTINGS, config_option, describe


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
    from .config import ServeConfig
    from .logs import setup_logging
    from .server import Server

    if print_config:
        click.echo(describe(ctx, values))
        return
    setup_logging(values["log_level"], values["log_format"])
    optional = {} if values["demo_vocab_size"] is None else {"demo_vocab_size": values["demo_vocab_size"]}
    rate = values["max_load_rate"]
    try:
        config = ServeConfig(
            checkpoint=values["checkpoint"], endpoint=values["socket"] or "",
            events_endpoint=values["events_socket"] or "", shm_dir=values["shm_dir"],
            load_threads=values["load_threads"], lease_seconds=values["lease_seconds"],
            max_load_rate=None if rate is None else rate * 1e6, reload_roots=list(values["reload_root"]),
            retire_grace_seconds=values["retire_grace_seconds"], group=values["group"],
            remote_status=values["remote_status"], curve_keys_dir=values["curve_keys_dir"],
            metrics_port=values["metrics_port"], metrics_address=values["metrics_address"],
            numa_node=values["numa_node"], demo_seed=values["demo_seed"],
            progress_bar=sys.stderr.isatty() if values["progress"] is None else values["progress"], **optional)
        server = Server(config)
    except EngramError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    sys.exit(server.serve_forever())
