"""The engramd command line: the group, and reload, inspect, synth, keys, demo, bench.

``serve`` (cli/serve.py), ``status`` (cli/status.py), ``stop`` (cli/stop.py) and ``hot-rows`` (cli/hot_rows.py)
have files of their own.  A
stable contract for operators and scripts: ``status`` exits 0 iff the table is
ready, 1 if the daemon answers but is not ready, 3 if no daemon answers; every
other command exits non-zero with one ``error:`` line naming what is wrong, made
in one place (cli/error_map.py) for every command.
"""
from __future__ import annotations

import json
import os
import sys
import time

import click

from engram_client.core.errors import EngramTimeoutError
from engram_client.attach.readiness import wait_ready

from .. import __version__
from . import reach
from .error_map import MappedGroup, describe_os_error, fail
from .extras import missing_for
from ..reporting.sizes import human_bytes


def require_extra(command: str, modules: list[str] | None = None) -> None:
    """End ``command`` with its one line (extras.py) before it does anything, if a package it needs is missing."""
    missing = missing_for(command, modules)
    if missing is not None:
        fail(missing)


socket_option = click.option("--socket", "endpoint", default=None, metavar="ENDPOINT",
                             help="Daemon endpoint [default: $ENGRAMD_SOCKET or a per-user ipc:// path].")


@click.group(cls=MappedGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="engramd")
def main() -> None:
    """engramd: one Engram table per node, in /dev/shm, shared by every rank.

    Shell completion: eval "$(_ENGRAMD_COMPLETE=bash_source engramd)" (zsh_source, fish_source)."""


@main.command()
@socket_option
@click.option("--checkpoint", type=click.Path(file_okay=False), default=None,
              help="Load this checkpoint (under a reload root) [default: the one being served].")
@reach.wait_option("Wait up to this long for the new generation to be served.")
def reload(endpoint: str | None, checkpoint: str | None, wait_s: float) -> None:
    """Load generation g+1 beside g; g keeps serving until g+1 is complete."""
    reach.local_only(endpoint, "reload")
    connection = reach.connect(endpoint)
    try:
        started = reach.ask(connection, "reload",
                            {"checkpoint": os.path.abspath(checkpoint) if checkpoint else None})
        click.echo(f"loading generation {started['generation']} from {started['checkpoint']}")
        if wait_s:
            begun = time.monotonic()
            try:  # a failed generation raises NotReadyError, which names its error
                served = wait_ready(connection, wait_s, generation=started["generation"])
            except EngramTimeoutError as exc:
                if exc.unavailable is not None:
                    raise reach.unanswered(connection.endpoint, "status", time.monotonic() - begun) from exc
                fail(f"generation {started['generation']} was not served within {time.monotonic() - begun:.1f} s "
                     "(it goes on loading; see engramd status)")
            click.echo(f"generation {started['generation']} is served (after {time.monotonic() - begun:.1f} s)")
            if served.get("hot_rows_error"):  # a --hot-rows list that does not fit the reloaded table is dropped
                click.echo(f"generation {started['generation']} is {served['hot_rows_error']}")
    finally:
        connection.close()


@main.command()
@click.argument("checkpoint", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True)
def inspect(checkpoint: str, as_json: bool) -> None:
    """Layout, hashing and table size of a checkpoint, checked as `serve --checkpoint` checks it.

    Reads config.json, the index, the shards' headers and tokenizer.json, never the tensor
    data; its files must lie under the checkpoint's parent, as `serve` without --reload-root requires."""
    from ..loading.table_plan import plan_checkpoint
    from ..loading.token_map import describe_hashing

    plan, header = plan_checkpoint(checkpoint)  # a bad checkpoint's error becomes its error line
    hashing = describe_hashing(header.hashing)
    report = {"checkpoint": plan.directory, "fingerprint": plan.fingerprint, "table_bytes": header.total_bytes,
              "files": list(plan.files), "layers": [layout.to_dict() for layout in plan.layouts],
              "hashing": hashing}
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"checkpoint  {plan.directory}")
    click.echo(f"table       {human_bytes(header.total_bytes)} ({header.total_bytes} bytes)")
    for layout in plan.layouts:
        click.echo(f"  layer {layout.layer:>3}: {layout.rows} rows x {layout.head_dim} "
                   f"(+{layout.scale_cols} scale bytes), {len(layout.head_sizes)} heads")
    click.echo("hashing     " + (f"{hashing['vocab']} token ids -> {hashing['compressed_vocab']} compressed ids, "
                                 f"pad token {hashing['pad_token_id']}" if hashing else
                                 "none: ranks look rows up by id only"))
    click.echo(f"files       {len(plan.files)}")


def _int_list(_ctx: click.Context, _param: click.Parameter, value: str) -> list[int]:
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
@click.option("--tokenizer-vocab", default=0, show_default=True, type=int,
              help="Also write a synthetic tokenizer.json of this many ids (0: none), for hashing tokens.")
@click.option("--force", is_flag=True, help="Write into a non-empty directory, replacing only checkpoint files.")
def synth(outdir: str, vocab_size: int, layers: list[int], max_ngram: int, heads: int, head_dim: int, seed: int,
          shards: int, tokenizer_vocab: int, force: bool) -> None:
    """Write a synthetic checkpoint in DeepSeek-V4.1's Engram layout into an empty or new directory."""
    require_extra("synth")  # before anything is written
    from ..synth.writer import write_checkpoint
    from ..synth.target import prepare_outdir

    try:
        removed, kept = prepare_outdir(outdir, force)
        config = write_checkpoint(outdir, vocab_size, layers, max_ngram, heads, head_dim, seed, shards,
                                  tokenizer_vocab=tokenizer_vocab)
    except OSError as exc:
        fail(f"cannot write the checkpoint in {outdir}: {describe_os_error(exc)}")
    if removed:
        click.echo(f"removed the old checkpoint files {', '.join(removed)}" +
                   (f"; kept {', '.join(kept)}" if kept else ""))
    click.echo(f"wrote {outdir}: layers {config['engram_layer_ids']}, rows {config['engram_num_embeddings']}")


@main.command()
@click.option("--ranks", default=None, type=click.IntRange(min=1),
              help="Rank processes [default: one per GPU, else 2 CPU ranks].")
@click.option("--device", "device_kind", default="auto", type=click.Choice(["auto", "cpu", "cuda"]), show_default=True)
@click.option("--lookups", default=20, show_default=True, type=click.IntRange(min=1), help="Lookups per rank.")
@click.option("--ids-per-lookup", default=4096, show_default=True, type=click.IntRange(min=1))
def demo(ranks: int | None, device_kind: str, lookups: int, ids_per_lookup: int) -> None:
    """The main job: a daemon on the demo table, ranks that attach, look up and verify, then a clean stop."""
    require_extra("demo")
    from engram_client.tools.demo_job import run_demo

    sys.exit(run_demo(ranks, device_kind, lookups, ids_per_lookup))


@main.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Replace the keys DIRECTORY already holds.")
def keys(directory: str, force: bool) -> None:
    """Create CURVE keys for --remote-status: a server keypair and one authorized client keypair."""
    from ..guards.curve_keys import CurveConfigError, check_keys_directory, create_keys

    try:  # before anything is read or written there: another user's directory may hold planted keys
        if os.path.lexists(directory):
            check_keys_directory(directory, "keys directory")
    except CurveConfigError as exc:
        fail(str(exc))
    existing = [name for name in ("server.key_secret", "client.key_secret")
                if os.path.exists(os.path.join(directory, name))]
    if existing and not force:
        # New keys would lock out every daemon and monitor still using the old ones.
        fail(f"{directory} already holds CURVE keys ({', '.join(existing)}); a daemon started with them and its "
             "monitors keep using them. Pass --force to replace them")
    try:
        paths = create_keys(directory)
    except CurveConfigError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot create CURVE keys in {directory}: {describe_os_error(exc)}")
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
              help="Also time both paths with a hot-row cache of this size (0: skip).")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), help="Also write the results here.")
@click.option("--markdown", is_flag=True, help="Also print the tables as docs/BENCHMARKS.md records them.")
def bench(endpoint: str | None, table_gib: float, iterations: int, strategies: str, load_threads: int,
          overlap_steps: int, max_programs: str, hot_cache_gib: float, json_path: str | None, markdown: bool) -> None:
    """Lookup speed on the GPU: plain copy vs naive index_select vs both lookup paths (needs CUDA)."""
    require_extra("bench")
    import torch

    if not torch.cuda.is_available():
        fail("engramd bench needs a CUDA device")
    require_extra("bench", ["triton"])
    from engram_client.tools.bench import main as run, print_results

    from engram_client.lookup.config import default_max_programs

    caps = [default_max_programs(torch.device("cuda", 0)) if c.strip() == "default" else (int(c) or None)
            for c in max_programs.split(",") if c.strip()]
    results = run(endpoint, table_gib, iterations, [s for s in strategies.split(",") if s], load_threads,
                  overlap_steps, caps, hot_cache_gib)
    print_results(results)
    if markdown:
        from engram_client.tools.bench_markdown import markdown as as_markdown

        print(as_markdown(results))
    if json_path:
        from engram_client.tools.run_meta import run_meta

        results["meta"] = run_meta(" ".join(["engramd", *sys.argv[1:]]))  # docs/BENCHMARKS.md is rendered from it
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)


from .serve import serve  # noqa: E402  (after main exists; serve.py needs nothing from here)
from .status import status  # noqa: E402
from .stop import stop  # noqa: E402
from .hot_rows import hot_rows  # noqa: E402

main.add_command(serve)
main.add_command(hot_rows)
main.add_command(status)
main.add_command(stop)

if __name__ == "__main__":
    main()
