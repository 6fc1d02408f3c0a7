"""Helpers shared by the benchmark scripts: sizes, timing summaries, tmpfs mounts."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import time


def write_json(path: str | None, results) -> None:
    """The results as indented JSON at ``path`` (--json), when one was given."""
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=2)


def lookup_parser(doc: str, iterations: int) -> argparse.ArgumentParser:
    """The options of the single-client lookup benchmarks: --endpoint, --rows, --iterations, --table-gib, --json."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--endpoint", help="an engramd already serving [default: start one on a demo table]")
    parser.add_argument("--rows", type=int, default=6144)
    parser.add_argument("--iterations", type=int, default=iterations)
    parser.add_argument("--table-gib", type=float, default=8.0)
    parser.add_argument("--json")
    return parser


@contextlib.contextmanager
def serving(endpoint: str | None, table_gib: float, load_threads: int = 8):
    """The endpoint to measure: ``endpoint`` itself, or a daemon started on a demo table of
    ``table_gib`` GiB (built in memory) and stopped afterwards."""
    if endpoint is not None:
        yield endpoint
        return
    from engram_client.tools.bench import start_daemon

    proc, endpoint, _ = start_daemon(table_gib, load_threads=load_threads)
    try:
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def summary(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "n": len(samples)}


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def mount_huge_tmpfs(path: str, size: str) -> bool:
    """Mount a huge=always tmpfs at ``path`` (needs root); False if the machine refuses."""
    os.makedirs(path, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},huge=always", "tmpfs", path],
                            capture_output=True, text=True)
    return result.returncode == 0


def unmount(path: str) -> None:
    subprocess.run(["umount", path], capture_output=True)


def drop_file(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
