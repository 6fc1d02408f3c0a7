"""The daemon's status reply rendered for a terminal (``engramd status``, ``engramd demo``)."""
from __future__ import annotations

import time

import click

from engram_client.core.protocol import LOADING

from .progress import render


def human_bytes(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def print_status(status: dict) -> None:
    """The status reply as an operator reads it: state, generation, table, layers, hashing, load, reload, clients."""
    click.echo(f"state       {status['state']}" + (f"  ({status['error']})" if status.get("error") else ""))
    click.echo(f"generation  {status['generation']}   boot {status['boot_id']}   pid {status.get('pid')}")
    click.echo(f"checkpoint  {status['checkpoint']}")
    click.echo(f"table       {human_bytes(status['table_bytes'])}  {status.get('table_path') or ''}")
    for layer in status["layers"]:
        click.echo(f"  layer {layer['layer']:>3}: {layer['rows']} rows x {layer['head_dim']}, "
                   f"{len(layer['head_sizes'])} heads")
    hashing = status.get("hashing")
    if hashing:
        click.echo(f"hashing     {hashing['vocab']} token ids -> {hashing['compressed_vocab']} compressed, "
                   f"n-grams up to {hashing['max_ngram']}, pad token {hashing['pad_token_id']}")
    if status["state"] == LOADING:
        click.echo("  " + render(status["load"]["done_bytes"], status["load"]["total_bytes"]))
    reload = status.get("reload")
    if reload:
        line = f"reload      generation {reload['generation']} from {reload['checkpoint']}: {reload['state']}"
        if reload["state"] == LOADING:
            line += "  " + render(reload["load"]["done_bytes"], reload["load"]["total_bytes"])
        click.echo(line + (f"  ({reload['error']})" if reload.get("error") else ""))
    if status.get("numa_node") is not None:
        click.echo(f"numa node   {status['numa_node']}")
    click.echo(f"clients     {len(status['clients'])}")
    for client in status["clients"]:
        attached = time.strftime("%H:%M:%S", time.localtime(client["attached_at"]))
        click.echo(f"  {client['id']:<14} pid {client['pid']:<8} {client['device']:<8} rank {client['rank']}  "
                   f"attached {attached}")
