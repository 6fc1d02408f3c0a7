"""A real tmpfs mounted for one test: mounted with the given options, or the test skips (mounting
needs root), and always unmounted afterwards."""
from __future__ import annotations

import contextlib
import pathlib
import subprocess
from typing import Iterator

import pytest


@contextlib.contextmanager
def mounted_tmpfs(mount_point: pathlib.Path, options: str) -> Iterator[str]:
    """Mount a tmpfs with ``options`` (e.g. "size=4M", "ro,size=1m", "huge=always,size=64m") at
    ``mount_point`` (created if missing) and yield its path; skip the test if it cannot be mounted."""
    mount_point.mkdir(exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
                             capture_output=True, text=True, timeout=30)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs with {options} here (needs root): {mounted.stderr.strip()}")
    try:
        yield str(mount_point)
    finally:
        # Lazily if a process still holds files there: the next test must not find it mounted.
        if subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=30).returncode:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)
