"""Helpers shared by the benchmark scripts: sizes, timing summaries, tmpfs mounts."""
from __future__ import annotations

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
