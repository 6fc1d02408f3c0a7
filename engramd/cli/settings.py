"""Every `engramd serve` setting in one table: its flag, environment variable, TOML key, default.

Precedence, highest first (one rule for every setting):

    1. the command-line flag            --shm-dir /mnt/huge
    2. the environment variable         ENGRAMD_SHM_DIR=/mnt/huge
    3. the TOML file (--config FILE or $ENGRAMD_CONFIG)   shm_dir = "/mnt/huge"
    4. the built-in default

A TOML key this table does not know is an error, never ignored, and so is an ENGRAMD_* variable
that no part of engramd reads (engram_client/core/variables.py lists the others) or an empty one
that ``serve`` reads (click would take it as unset; an empty ENGRAMD_CHECKPOINT serves the demo
table, with a warning naming it).  ``--print-config``
shows the effective value of each setting and where it came from, and an error about a
setting names it where the operator set it: the flag, the variable, or the file and key.  Defaults are
ServeConfig's, and ``serve_config`` turns the effective values into a ServeConfig:
a setting is added here (and to ServeConfig, if the daemon uses it) and nowhere else.
"""
from __future__ import annotations

import difflib
import json
import re
import sys
import tomllib
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

import click
from click.core import ParameterSource

from engram_client.core.budget_file import DECODE_QUIET_NS, DECODE_SPARES, PREFILL_GATHERS
from engram_client.core.demo_rows import DEMO_VOCAB_SIZE
from engram_client.core.variables import CONFIG, PREFIX, READERS, setting_variable

from ..daemon.config import ServeConfig

DEFAULTS = {f.name: f.default for f in fields(ServeConfig) if f.init}
CONFIG_FILE = "engramd.config_file"  # ctx.meta key: the TOML file read, for errors about its keys


def origin(ctx: click.Context | None, name: str) -> str | None:
    """Where the operator set ``name``, in words an error can start with; None for the flag or the default."""
    source = ctx.get_parameter_source(name) if ctx is not None else None
    if source is ParameterSource.ENVIRONMENT:
        return BY_NAME[name].envvar
    if source is ParameterSource.DEFAULT_MAP:
        return f"{name} in {ctx.meta.get(CONFIG_FILE, 'the --config file')}"
    return None


class SettingOption(click.Option):
    """A setting's option: a bad value is named where it was set (click names the flag and
    the variable whatever the source, so a bad TOML value read as a bad environment variable)."""

    def get_error_hint(self, ctx: click.Context | None) -> str:
        return origin(ctx, self.name) or f"'{self.opts[0]}'"


@dataclass(frozen=True)
class Setting:
    name: str  # TOML key, click parameter name
    type: Any
    default: Any
    help: str
    multiple: bool = False
    flag: str | None = None  # overrides the flag spelled from the name
    metavar: str | None = None
    field: str | None = None  # the ServeConfig field it sets (None: the command uses it itself)
    to_config: Callable[[Any], Any] | None = None  # effective value -> that field's value

    @property
    def envvar(self) -> str:
        return setting_variable(self.name)

    def option(self):
        flag = self.flag or "--" + self.name.replace("_", "-")
        return click.option(flag, self.name, cls=SettingOption, type=self.type, default=self.default,
                            multiple=self.multiple, envvar=self.envvar, show_envvar=True,
                            show_default=self.default not in (None, ()), metavar=self.metavar, help=self.help)


PATH = click.Path(file_okay=False)
SETTINGS = [
    Setting("checkpoint", PATH, None, "Checkpoint directory; without it, the embedded demo table is served.",
            field="checkpoint"),
    Setting("socket", str, None, "Request endpoint [default: a per-user ipc:// path].", metavar="ENDPOINT",
            field="endpoint", to_config=lambda value: value or ""),
    Setting("events_socket", str, None, "PUB endpoint [default: <socket>.events].", metavar="ENDPOINT",
            field="events_endpoint", to_config=lambda value: value or ""),
    Setting("shm_dir", PATH, DEFAULTS["shm_dir"], "Where the table file lives (tmpfs, huge=always tmpfs or "
            "hugetlbfs).", field="shm_dir"),
    Setting("allow_disk", bool, False, "Accept an --shm-dir that is not tmpfs or hugetlbfs (the table then lives "
            "on disk and ranks page it in from there).", flag="--allow-disk/--no-allow-disk"),
    Setting("load_threads", int, DEFAULTS["load_threads"], "Parallel copy threads.", field="load_threads"),
    Setting("lease_seconds", float, DEFAULTS["lease_seconds"], "A client that sends no heartbeat for this long is "
            "dropped.", field="lease_seconds"),
    Setting("max_load_rate", float, None, "Cap the load's copy rate, to spare running engines' memory bandwidth.",
            metavar="MB_PER_S", field="max_load_rate", to_config=lambda value: None if value is None else value * 1e6),
    Setting("reload_root", PATH, (), "Directory under which `reload --checkpoint` may read [default: the "
            "checkpoint's parent]; repeatable.", multiple=True, field="reload_roots", to_config=list),
    Setting("retire_grace_seconds", float, DEFAULTS["retire_grace_seconds"], "A replaced generation's file is "
            "removed once no client holds it, or after this long.", field="retire_grace_seconds"),
    Setting("group", str, None, "Also let this group use the socket and read the table (modes 0660/0640).",
            field="group"),
    Setting("remote_status", str, None, "Also answer status (only) over TCP, with CURVE.", metavar="tcp://HOST:PORT",
            field="remote_status"),
    Setting("curve_keys_dir", PATH, None, "Keys made by `engramd keys DIR` (for --remote-status).",
            field="curve_keys_dir"),
    Setting("metrics_port", int, None, "Serve Prometheus metrics on this port [default: off].", field="metrics_port"),
    Setting("metrics_address", str, DEFAULTS["metrics_address"], "Address for the metrics port (0.0.0.0 for a "
            "cluster scraper).", field="metrics_address"),
    Setting("numa_node", int, None, "Place the table's pages on this NUMA node.", field="numa_node"),
    Setting("numa_replicas", str, None, "One copy of the table per NUMA node: 'all' (each node with GPUs) or a "
            "node list (0,1); costs the table's size once per node.", metavar="all|NODES", field="numa_replicas"),
    Setting("gather_cpus", str, None, "The node's gather budget, shared by every rank: CPUs (0-13,16-29), a share "
            "of them (75%), or off (each rank sizes its own pool) [default: every CPU less one per GPU].",
            metavar="LIST|N%|off", field="gather_cpus"),
    Setting("prefill_gathers", click.Choice(sorted(PREFILL_GATHERS)), DEFAULTS["prefill_gathers"],
            "Priority of the ranks' prefill-size gathers (over 16,384 rows): idle runs them at SCHED_IDLE, so "
            "decode-size lookups beside them get CPUs at once, but they gather only where no other thread of "
            "normal priority wants the CPU (docs/BENCHMARKS.md).", field="prefill_gathers"),
    Setting("decode_cpus", str, DEFAULTS["decode_cpus"], "CPUs of each budget group (its last ones) where no "
            "prefill-size gather of normal priority runs, and as many tokens kept for decode-size lookups: a number, "
            "or auto (two per 5 tokens, rounded down, in groups of 4 or more; 0 with --prefill-gathers idle).",
            metavar="auto|N", field="decode_cpus"),
    Setting("decode_spares", click.Choice(sorted(DECODE_SPARES)), DEFAULTS["decode_spares"],
            "Threads at SCHED_IDLE on the decode CPUs that gather prefill-size calls while those CPUs are otherwise "
            "free: quiet, only while no rank of their budget group (NUMA node) has started a decode-size lookup in "
            f"the last {DECODE_QUIET_NS // 10**6} ms; idle, "
            "beside decode calls too; off leaves the decode CPUs to decode-size calls alone.", field="decode_spares"),
    Setting("hot_rows", click.Path(dir_okay=False), None, "A hot-row list (engramd hot-rows build) for the ranks' HBM "
            "row cache; it must fit the table, else the first load fails (a reload serves without it).",
            metavar="FILE", field="hot_rows"),
    Setting("demo_vocab_size", int, None, f"Vocab size of the demo table [default: {DEMO_VOCAB_SIZE}].",
            field="demo_vocab_size", to_config=lambda value: DEMO_VOCAB_SIZE if value is None else value),
    Setting("demo_seed", int, DEFAULTS["demo_seed"], "Seed of the demo table.", field="demo_seed"),
    Setting("progress", bool, None, "Progress bar while loading [default: on a terminal].",
            flag="--progress/--no-progress", field="progress_bar",
            to_config=lambda value: sys.stderr.isatty() if value is None else value),
    Setting("log_level", click.Choice(["debug", "info", "warning", "error"]), "info", "Log level."),
    Setting("log_format", click.Choice(["text", "json"]), "text", "Human-readable lines, or one JSON object per line."),
]
BY_NAME = {setting.name: setting for setting in SETTINGS}
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*")


def attributed(ctx: click.Context, message: str) -> str:
    """A refusal that names a setting by its flag (ServeConfig's, the shm dir check's), reworded
    for a value set elsewhere: ``ENGRAMD_LOAD_THREADS must be ...``, ``FILE: load_threads must be ...``."""
    for match in _FLAG.finditer(message):
        name = match.group(0)[2:].replace("-", "_")
        if name not in BY_NAME:
            continue
        source = ctx.get_parameter_source(name)
        if source is ParameterSource.ENVIRONMENT:
            return message[:match.start()] + BY_NAME[name].envvar + message[match.end():]
        if source is ParameterSource.DEFAULT_MAP:
            return f"{ctx.meta.get(CONFIG_FILE)}: " + message[:match.start()] + name + message[match.end():]
        return message
    return message


def load_toml(ctx: click.Context, _param, path: str | None) -> str | None:
    """Eager --config callback: the file's values become click's defaults (below env and flags).
    Its errors name the file (and the key), as UsageErrors: one line, not blamed on $ENGRAMD_CONFIG."""
    if not path:
        return path
    try:
        with open(path, "rb") as f:
            values = tomllib.load(f)
    except OSError as exc:
        raise click.UsageError(f"cannot read the config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise click.UsageError(f"{path} is not valid TOML: {exc}") from exc
    unknown = sorted(set(values) - set(BY_NAME))
    if unknown:
        raise click.UsageError(f"{path}: unknown settings {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    for name, value in values.items():
        if BY_NAME[name].multiple and not isinstance(value, list):
            raise click.UsageError(f"{path}: {name} must be a list")
    ctx.default_map = {**(ctx.default_map or {}), **values}
    ctx.meta[CONFIG_FILE] = path
    return path


def check_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """Refuse an ENGRAMD_* variable nothing reads, or an empty one ``serve`` reads, naming it;
    returns the variables let through although empty, each with what it means."""
    read_here = {setting.envvar for setting in SETTINGS} | {CONFIG}
    known = read_here | set(READERS)
    let_through = {}
    for name in sorted(environ):
        if not name.startswith(PREFIX):
            continue
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            raise click.UsageError(f"environment variable {name}: no part of engramd reads it"
                                   + (f" (did you mean {close[0]}?)" if close else "")
                                   + f"; unset it. Known: {', '.join(sorted(known))}")
        if name in read_here and not environ[name].strip():
            if name == BY_NAME["checkpoint"].envvar:  # documented for unit files: empty means the demo table
                let_through[name] = "set but empty: no checkpoint, the demo table is served"
                continue
            raise click.UsageError(f"environment variable {name} is set but empty; give it a value or unset it")
    return let_through


def config_option():
    return click.option("--config", "config_file", type=click.Path(dir_okay=False), envvar=CONFIG,
                        show_envvar=True, is_eager=True, expose_value=True, callback=load_toml,
                        help="TOML file of settings (keys as the flags, with underscores).")


SOURCES = {ParameterSource.COMMANDLINE: "command line", ParameterSource.ENVIRONMENT: "environment",
           ParameterSource.DEFAULT_MAP: "config file", ParameterSource.DEFAULT: "default"}


def describe(ctx: click.Context, values: dict[str, Any], resolved: dict[str, Any] | None = None,
             notes: dict[str, str] | None = None) -> str:
    """The effective settings as TOML, each with where its value came from; ``resolved`` holds
    what the daemon makes of a value (absolute paths, the default endpoint, the checkpoint it
    will serve) where that differs, ``notes`` why, where the reason is not plain."""
    lines = []
    for setting in SETTINGS:
        value = values[setting.name]
        source = SOURCES.get(ctx.get_parameter_source(setting.name), "default")
        if source == "environment":
            source += f" ({setting.envvar})"
        if resolved and setting.name in resolved:
            given = "unset" if value is None or value == () else json.dumps(list(value) if isinstance(value, tuple)
                                                                              else value)
            source += f"; resolved from {given}"
            value = resolved[setting.name]
        if notes and setting.name in notes:
            source += f": {notes[setting.name]}"
        if value is None or value == ():
            lines.append(f"# {setting.name} = (unset)  # {source}")
        else:
            rendered = json.dumps(list(value) if isinstance(value, (tuple, list)) else value)
            lines.append(f"{setting.name} = {rendered}  # {source}")
    return "\n".join(lines)



def serve_config(values: dict[str, Any]) -> ServeConfig:
    """The ServeConfig the effective settings describe (validated by ServeConfig itself)."""
    return ServeConfig(**{setting.field: setting.to_config(values[setting.name]) if setting.to_config
                          else values[setting.name] for setting in SETTINGS if setting.field})
