"""`engramd serve`: settings from flags, ENGRAMD_* variables and a TOML file, then the server."""
from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, NoReturn

import click

from engram_client.core.errors import EngramError
from engram_client.core.variables import PREFIX

from .settings import SETTINGS, attributed, check_environment, config_option, describe, serve_config

if TYPE_CHECKING:
    from ..daemon.config import ServeConfig
    from ..shm.fs_check import ShmFilesystem

log = logging.getLogger("engramd")


def _with_settings(fn: Callable[..., None]) -> Callable[..., None]:
    for setting in reversed(SETTINGS):
        fn = setting.option()(fn)
    return fn


def _resolved(values: dict[str, Any], config: "ServeConfig", checkpoint: str | None) -> dict[str, Any]:
    """The settings whose value the daemon turns into something else (a default endpoint, an absolute
    path, the checkpoint it will serve, the budget's CPUs, a default it fills in)."""
    from engram_client.core.numa_nodes import format_cpu_list

    budget = [cpu for group in config.budget_groups for cpu in group.cpus]
    made = {"socket": config.endpoint, "events_socket": config.events_endpoint, "shm_dir": config.shm_dir,
            "checkpoint": checkpoint, "reload_root": list(config.reload_roots),
            "gather_cpus": format_cpu_list(budget) if budget else "off",
            "demo_vocab_size": config.demo_vocab_size, "progress": config.progress_bar}
    given = {name: list(value) if isinstance(value, tuple) else value for name, value in values.items()}
    return {name: value for name, value in made.items() if value not in (None, []) and value != given[name]}


def _refuse(ctx: click.Context, exc: EngramError) -> NoReturn:
    click.echo(f"error: {attributed(ctx, str(exc))}", err=True)
    sys.exit(1)


def _checked(ctx: click.Context, values: dict[str, Any]) -> tuple["ServeConfig", "ShmFilesystem", dict[str, str]]:
    """The settings as ``serve`` takes them: the ServeConfig, the shm dir's file system and the
    empty variables let through; ``serve`` and ``--print-config`` both refuse here, alike."""
    from ..shm.fs_check import check_shm_dir

    let_through = check_environment(os.environ)
    try:
        config = serve_config(values)
        return config, check_shm_dir(config.shm_dir, values["allow_disk"]), let_through
    except EngramError as exc:
        _refuse(ctx, exc)


def _print_config(ctx: click.Context, values: dict[str, Any]) -> None:
    from ..daemon.start_checkpoint import first_checkpoint

    config, _, let_through = _checked(ctx, values)
    checkpoint, why = first_checkpoint(config)  # what a start now would serve: a recorded reload target wins
    notes = {"checkpoint": why} if why else {}
    for variable, meaning in let_through.items():
        name = variable[len(PREFIX):].lower()
        notes[name] = "; ".join(filter(None, [f"{variable} is {meaning}", notes.get(name)]))
    click.echo(describe(ctx, values, _resolved(values, config, checkpoint), notes))


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

    if print_config:
        _print_config(ctx, values)
        return
    setup_logging(values["log_level"], values["log_format"])
    config, shm, let_through = _checked(ctx, values)
    for variable, meaning in let_through.items():
        log.warning("%s is %s", variable, meaning)
    try:
        server = Server(config)
    except EngramError as exc:
        _refuse(ctx, exc)
    (log.info if shm.in_memory else log.warning)(shm.describe())
    sys.exit(server.serve_forever())
