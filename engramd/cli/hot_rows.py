"""`engramd hot-rows build`: the hot-row list a daemon serves (``serve --hot-rows``), from text files."""
from __future__ import annotations

import click

from ..reporting.sizes import human_bytes


@click.group("hot-rows")
def hot_rows() -> None:
    """Hot-row lists: each layer's most looked-up rows, for the ranks' HBM row cache."""


@hot_rows.command()
@click.argument("checkpoint", type=click.Path(file_okay=False))
@click.argument("texts", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The list to write.")
@click.option("--rows-per-layer", type=int, default=None, help="Keep this many rows of each layer.")
@click.option("--fraction", type=float, default=None,
              help="Keep this share of each layer's rows [default: 0.02].")
@click.option("--force", is_flag=True, help="Replace --out if it is a hot-row list (nothing else is replaced).")
def build(checkpoint: str, texts: tuple[str, ...], out: str, rows_per_layer: int | None, fraction: float | None,
          force: bool) -> None:
    """Count the rows CHECKPOINT's lookups of TEXT... hit, per layer, and write the most frequent.

    Build it from the traffic it will serve: the same kind of text or code the engine sees.
    The checkpoint's tokenizer.json and hashing section turn the text into row ids, exactly as
    a rank's lookups do; each file is one sequence."""
    from ..loading.hot_rows_build import build_hot_rows

    if rows_per_layer is not None and fraction is not None:
        raise click.UsageError("give --rows-per-layer or --fraction, not both")
    summary = build_hot_rows(checkpoint, list(texts), out, rows_per_layer=rows_per_layer,
                             fraction=0.02 if fraction is None else fraction, force=force)
    click.echo(f"wrote {summary['out']} ({human_bytes(summary['bytes'])}) from {summary['tokens']:,} tokens "
               f"of {len(texts)} file(s), for checkpoint fingerprint {summary['fingerprint']}")
    for layer in summary["layers"]:
        share = layer["covered"] / max(layer["lookups"], 1)
        click.echo(f"  layer {layer['layer']:>3}: {layer['kept']:,} of {layer['rows']:,} rows, "
                   f"{share:.1%} of the text's {layer['lookups']:,} lookups")
