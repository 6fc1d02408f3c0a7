"""The main job: engramd on its demo table, demo ranks attached, status shown, clean stop.

Everything lives in a fresh temporary socket dir and shm dir, removed at the end,
so the job never touches a daemon already running on the machine.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time

import click

from engram_client.attach.connection import DaemonConnection
from engram_client.core.errors import EngramError
from engram_client.attach.readiness import wait_ready
from engram_client.tools.serve_process import CHILD_PYTHON, launch_serve
from engramd.reporting.sizes import human_bytes
from engramd.reporting.status_text import print_status

READY_TIMEOUT_S = 120.0
RANK_TIMEOUT_S = 300.0


def _devices(ranks: int | None, kind: str) -> list[str]:
    import torch

    gpus = torch.cuda.device_count() if kind in ("auto", "cuda") else 0
    if kind == "cuda" and gpus == 0:
        raise click.ClickException("--device cuda, but torch sees no CUDA device")
    if gpus:
        return [f"cuda:{i % gpus}" for i in range(ranks or gpus)]
    return ["cpu"] * (ranks or 2)


def _wait_ready(connection: DaemonConnection, daemon: subprocess.Popen) -> dict:
    try:
        return wait_ready(connection, READY_TIMEOUT_S, daemon=daemon)
    except EngramError as exc:
        raise click.ClickException(str(exc)) from exc


def run_demo(ranks: int | None, device_kind: str, lookups: int, ids_per_lookup: int) -> int:
    # A demo with nothing to check must not pass: the command line refuses these too.
    for name, value in (("--ranks", ranks), ("--lookups", lookups), ("--ids-per-lookup", ids_per_lookup)):
        if value is not None and value < 1:
            raise click.ClickException(f"{name} must be at least 1, got {value}")
    devices = _devices(ranks, device_kind)
    socket_dir = tempfile.mkdtemp(prefix="engramd-demo-")
    shm_dir = tempfile.mkdtemp(prefix="engramd-demo-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    spawned = time.monotonic()
    daemon = launch_serve(endpoint, shm_dir, allow_disk=not os.path.isdir("/dev/shm"))  # no tmpfs: a temp dir
    connection = DaemonConnection(endpoint)
    procs: list[subprocess.Popen] = []
    failed = True
    try:
        status = _wait_ready(connection, daemon)
        click.echo(f"engramd ready: demo table {human_bytes(status['table_bytes'])} in {shm_dir}, "
                   f"layers {[layer['layer'] for layer in status['layers']]}; started and loaded in "
                   f"{time.monotonic() - spawned:.2f} s")
        for rank, device in enumerate(devices):
            procs.append(subprocess.Popen(
                [*CHILD_PYTHON, "-m", "engram_client.tools.demo_rank", "--socket", endpoint, "--rank", str(rank),
                 "--device", device, "--lookups", str(lookups), "--ids", str(ids_per_lookup)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        reports = []
        for rank, proc in enumerate(procs):
            line = proc.stdout.readline()  # each rank prints its report, then holds its lease
            if not line:
                raise click.ClickException(f"rank {rank} exited with code {proc.wait(timeout=RANK_TIMEOUT_S)} "
                                           "before reporting")
            reports.append(json.loads(line))
        for report in reports:
            verdict = "OK" if report["mismatches"] == 0 and report["out_of_range_refused"] else "FAILED"
            click.echo(f"rank {report['rank']} pid {report['pid']} on {report['device']}: attached in "
                       f"{report['attach_seconds']:.2f} s, {report['lookups']} lookups, "
                       f"{report['rows_checked']} rows bit-exact vs reference: {report['mismatches']} mismatches, "
                       f"out-of-range ids refused: {report['out_of_range_refused']}  [{verdict}]")
        click.echo("--- engramd status with the ranks attached ---")
        print_status(connection.request("status", timeout=5.0))
        for proc in procs:
            proc.stdin.close()  # release the ranks; they detach as they exit
        codes = [proc.wait(timeout=RANK_TIMEOUT_S) for proc in procs]
        after = connection.request("status", timeout=5.0)
        click.echo(f"ranks exited with {codes}; clients still attached: {len(after['clients'])}")
        connection.request("stop", timeout=5.0)
        code = daemon.wait(timeout=60.0)
        click.echo(f"engramd stopped (exit {code}); table file removed: "
                   f"{not any(name.endswith('.table') for name in os.listdir(shm_dir))}")
        failed = any(codes) or code != 0 or bool(after["clients"])
    finally:
        connection.close()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        if daemon.poll() is None:
            daemon.terminate()
            try:
                daemon.wait(timeout=30.0)
            except subprocess.TimeoutExpired:
                daemon.kill()
        shutil.rmtree(socket_dir, ignore_errors=True)
        shutil.rmtree(shm_dir, ignore_errors=True)
    click.echo("demo " + ("FAILED" if failed else "passed"))
    return 1 if failed else 0
