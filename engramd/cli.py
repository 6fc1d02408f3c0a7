"""The engramd command line: serve, status, stop, inspect, synth, demo.

A stable contract for operators and scripts: ``status`` exits 0 iff the table is
ready, 1 if the daemon answers but is not ready, 3 if no daemon answers; every
other command exits non-zero with one ``error:`` line naming what is wrong.
"""
from __future__ import annotations

import json
import os
import sys
import time

import click

from engram_client.connection import DaemonConnection
from engram_client.errors import DaemonUnavailableError, EngramError

from . import __version__

EXIT_NOT_READY, EXIT_UNREACHABLE = 1, 3


def _fail(message: str, code: int = 1):
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _human_bytes(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


socket_option = click.option("--socket", "endpoint", default=None, metavar="ENDPOINT",
                             help="Daemon endpoint [default: $ENGRAMD_SOCKET or a per-user ipc:// path].")


@click.group()
@click.version_option(__version__, prog_name="engramd")
def main() -> None:
    """engramd: one Engram table per node, in /dev/shm, shared by every rank."""


def _print_status(status: dict) -> None:
    from .progress import render

    click.echo(f"state       {status['state']}" + (f"  ({status['error']})" if status.get("error") else ""))
    click.echo(f"generation  {status['generation']}   boot {status['boot_id']}   pid {status.get('pid')}")
    click.echo(f"checkpoint  {status['checkpoint']}")
    click.echo(f"table       {_human_bytes(status['table_bytes'])}  {status.get('table_path') or ''}")
    for layer in status["layers"]:
        click.echo(f"  layer {layer['layer']:>3}: {layer['rows']} rows x {layer['head_dim']}, "
                   f"{len(layer['head_sizes'])} heads")
    if status["state"] == "loading":
        click.echo("  " + render(status["load"]["done_bytes"], status["load"]["total_bytes"]))
    reload = status.get("reload")
    if reload:
        line = f"reload      generation {reload['generation']} from {reload['checkpoint']}: {reload['state']}"
        if reload["state"] == "loading":
            line += "  " + render(reload["load"]["done_bytes"], reload["load"]["total_bytes"])
        click.echo(line + (f"  ({reload['error']})" if reload.get("error") else ""))
    if status.get("numa_node") is not None:
        click.echo(f"numa node   {status['numa_node']}")
    total = status.get("clients_total", len(status["clients"]))
    shown = "" if total == len(status["clients"]) else f"  (the oldest {len(status['clients'])} listed)"
    click.echo(f"clients     {total}{shown}")
    for client in status["clients"]:
        attached = time.strftime("%H:%M:%S", time.localtime(client["attached_at"]))
        click.echo(f"  {client['id']:<14} pid {client['pid']:<8} {client['device']:<8} rank {client['rank']}  "
                   f"attached {attached}")


@main.command()
@socket_option
@click.option("--json", "as_json", is_flag=True, help="Print the status object as JSON.")
@click.option("--curve-keys-dir", default=None, type=click.Path(file_okay=False),
              help="For a tcp:// socket: use DIR/client.key_secret and trust DIR/server.key.")
@click.option("--wait", "wait_s", default=0.0, type=float, metavar="SECONDS",
              help="Wait up to this long for the table to be ready.")
def status(endpoint, as_json, curve_keys_dir, wait_s) -> None:
    """Print the daemon's status; exit 0 iff its table is ready (1 not ready, 3 unreachable)."""
    try:
        connection = DaemonConnection(endpoint, curve_keys_dir=curve_keys_dir)
    except EngramError as exc:
        _fail(str(exc))
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                reply = connection.request("status", timeout=max(0.5, min(2.0, deadline - time.monotonic())))
            except DaemonUnavailableError as exc:
                reply, unreachable = None, exc
            except EngramError as exc:
                _fail(str(exc))
            # A failed load never becomes ready by itself: no point waiting out --wait.
            if (reply is not None and reply["state"] in ("ready", "failed")) or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
    finally:
        connection.close()
    if reply is None:
        _fail(str(unreachable), EXIT_UNREACHABLE)
    if as_json:
        click.echo(json.dumps(reply, indent=2, sort_keys=True))
    else:
        _print_status(reply)
    sys.exit(0 if reply["state"] == "ready" else EXIT_NOT_READY)


@main.command()
@socket_option
@click.option("--timeout", default=10.0, show_default=True, type=float, help="Seconds to wait for the daemon to exit.")
def stop(endpoint, timeout) -> None:
    """Ask the daemon to stop; returns once it no longer answers."""
    connection = DaemonConnection(endpoint)
    try:
        connection.request("stop", timeout=5.0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                connection.request("status", timeout=0.5)
            except DaemonUnavailableError:
                click.echo("engramd stopped")
                return
            time.sleep(0.1)
        _fail(f"engramd at {connection.endpoint} still answers {timeout:.0f} s after stop")
    except EngramError as exc:
        _fail(str(exc), EXIT_UNREACHABLE if isinstance(exc, DaemonUnavailableError) else 1)
    finally:
        connection.close()


@main.command()
@socket_option
@click.option("--checkpoint", type=click.Path(file_okay=False), default=None,
              help="Load this checkpoint (under a reload root) [default: the one being served].")
@click.option("--wait", "wait_s", default=0.0, type=float, metavar="SECONDS",
              help="Wait up to this long for the new generation to be served.")
def reload(endpoint, checkpoint, wait_s) -> None:
    """Load generation g+1 beside g; g keeps serving until g+1 is complete."""
    connection = DaemonConnection(endpoint)
    try:
        started = connection.request("reload", {"checkpoint": os.path.abspath(checkpoint) if checkpoint else None})
        click.echo(f"loading generation {started['generation']} from {started['checkpoint']}")
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            status = connection.request("status", timeout=5.0)
            pending = status["reload"]
            if status["generation"] == started["generation"] and status["state"] == "ready":
                click.echo(f"generation {started['generation']} is served")
                return
            if (pending and pending["generation"] == started["generation"] and pending["state"] == "failed") or \
                    (status["generation"] == started["generation"] and status["state"] == "failed"):
                _fail(f"generation {started['generation']} failed: {(pending or status)['error']}")
            time.sleep(0.2)
        if wait_s:
            _fail(f"generation {started['generation']} was not served within {wait_s:.0f} s")
    except EngramError as exc:
        _fail(str(exc), EXIT_UNREACHABLE if isinstance(exc, DaemonUnavailableError) else 1)
    finally:
        connection.close()


@main.command()
@click.argument("checkpoint", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True)
def inspect(checkpoint, as_json) -> None:
    """Layout and table size of a checkpoint, from its headers alone."""
    from engram_client.table_file import TableHeader

    from .checkpoint import read_checkpoint

    try:
        plan = read_checkpoint(checkpoint)
    except EngramError as exc:
        _fail(str(exc))
    header = TableHeader.plan(plan.layouts, plan.fingerprint, plan.directory, generation=1)
    report = {"checkpoint": plan.directory, "fingerprint": plan.fingerprint, "table_bytes": header.total_bytes,
              "files": list(plan.files), "layers": [layout.to_dict() for layout in plan.layouts]}
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"checkpoint  {plan.directory}")
    click.echo(f"table       {_human_bytes(header.total_bytes)} ({header.total_bytes} bytes)")
    for layout in plan.layouts:
        click.echo(f"  layer {layout.layer:>3}: {layout.rows} rows x {layout.head_dim} "
                   f"(+{layout.scale_cols} scale bytes), {len(layout.head_sizes)} heads")
    click.echo(f"files       {len(plan.files)}")


def _int_list(_ctx, _param, value: str) -> list[int]:
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from exc


@main.command()
@click.argument("outdir", type=click.Path(file_okay=False))
@click.option("--vocab-size", default=2000, show_default=True, type=int)
@click.option("--layers", default="1,14", show_default=True, callback=_int_list)
@click.option("--max-ngram", default=4, show_default=True, type=int)
@click.option("--heads", default=8, show_default=True, type=int)
@click.option("--head-dim", default=256, show_default=True, type=int)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--shards", default=1, show_default=True, type=int)
def synth(outdir, vocab_size, layers, max_ngram, heads, head_dim, seed, shards) -> None:
    """Write a synthetic checkpoint in DeepSeek-V4.1's Engram layout."""
    from .synth import write_checkpoint

    try:
        config = write_checkpoint(outdir, vocab_size, layers, max_ngram, heads, head_dim, seed, shards)
    except EngramError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"{outdir}: cannot write the checkpoint: {exc.strerror or exc}")
    click.echo(f"wrote {outdir}: layers {config['engram_layer_ids']}, rows {config['engram_num_embeddings']}")


@main.command()
@click.option("--ranks", default=None, type=int, help="Rank processes [default: one per GPU, else 2 CPU ranks].")
@click.option("--device", "device_kind", default="auto", type=click.Choice(["auto", "cpu", "cuda"]), show_default=True)
@click.option("--lookups", default=20, show_default=True, type=int, help="Lookups per rank.")
@click.option("--ids-per-lookup", default=4096, show_default=True, type=int)
def demo(ranks, device_kind, lookups, ids_per_lookup) -> None:
    """The main job: a daemon on the demo table, ranks that attach, look up and verify, then a clean stop."""
    from .demo_job import run_demo

    sys.exit(run_demo(ranks, device_kind, lookups, ids_per_lookup))


@main.command()
@click.argument("directory", type=click.Path(file_okay=False))
def keys(directory) -> None:
    """Create CURVE keys for --remote-status: a server keypair and one authorized client keypair."""
    from .remote_status import create_keys

    paths = create_keys(directory)
    click.echo(f"server: {paths['server_secret']} (give the daemon --curve-keys-dir {directory})")
    click.echo(f"client: {paths['client_secret']} (authorized in {paths['authorized']}); "
               f"status --socket tcp://... --curve-keys-dir {directory}")


@main.command()
@socket_option
@click.option("--table-gib", default=64.0, show_default=True, type=float,
              help="Without --socket: start a daemon on a demo table of this size.")
@click.option("--iterations", default=7, show_default=True, type=int)
@click.option("--strategies", default="auto,dedup,direct", show_default=True)
@click.option("--load-threads", default=16, show_default=True, type=int)
@click.option("--overlap-steps", default=10, show_default=True, type=int)
@click.option("--max-programs", default="default,0", show_default=True,
              help="Comma-separated caps on the lookup grid to compare (0: uncapped; default: the client's).")
@click.option("--hot-cache-gib", default=1.0, show_default=True, type=float,
              help="Also time the default path with a hot-row cache of this size (0: skip).")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), help="Also write the results here.")
def bench(endpoint, table_gib, iterations, strategies, load_threads, overlap_steps, max_programs, hot_cache_gib,
          json_path) -> None:
    """Lookup speed on the GPU: plain copy vs naive index_select vs engram_client (needs CUDA)."""
    import torch

    from .bench import main as run, print_table

    if not torch.cuda.is_available():
        _fail("engramd bench needs a CUDA device")
    from engram_client.client import default_max_programs

    caps = [default_max_programs(torch.device("cuda", 0)) if c.strip() == "default" else (int(c) or None)
            for c in max_programs.split(",") if c.strip()]
    results = run(endpoint, table_gib, iterations, [s for s in strategies.split(",") if s], load_threads,
                  overlap_steps, caps, hot_cache_gib)
    print_table(results)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)


from .serve_cli import serve  # noqa: E402  (after main exists; serve_cli needs nothing from here)

main.add_command(serve)

if __name__ == "__main__":
    main()
