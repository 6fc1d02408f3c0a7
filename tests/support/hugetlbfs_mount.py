"""A real hugetlbfs mounted for one test, with huge pages reserved for it: mounted with the given
options, or the test skips (both need root), and always unmounted and the pages given back."""
from __future__ import annotations

import contextlib
import pathlib
import subprocess
from typing import Iterator

import pytest

NR_HUGEPAGES = "/proc/sys/vm/nr_hugepages"


@contextlib.contextmanager
def mounted_hugetlbfs(mount_point: pathlib.Path, pages: int, options: str = "") -> Iterator[str]:
    """Reserve ``pages`` 2 MiB pages and mount a hugetlbfs of that size at ``mount_point`` (created
    if missing), with ``options`` added (e.g. "mode=1777"); yield its path."""
    try:
        with open(NR_HUGEPAGES) as f:
            before = int(f.read())
        with open(NR_HUGEPAGES, "w") as f:
            f.write(str(before + pages))
    except OSError as exc:
        pytest.skip(f"cannot reserve huge pages here: {exc}")
    mount_point.mkdir(exist_ok=True)
    try:
        mount_options = ",".join(filter(None, ("pagesize=2M", f"size={pages * 2}M", options)))
        if subprocess.run(["mount", "-t", "hugetlbfs", "-o", mount_options, "none", str(mount_point)],
                          capture_output=True, timeout=30).returncode:
            pytest.skip("cannot mount hugetlbfs here")
        try:
            yield str(mount_point)
        finally:
            if subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=30).returncode:
                subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)
    finally:
        with open(NR_HUGEPAGES, "w") as f:
            f.write(str(before))
