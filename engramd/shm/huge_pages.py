"""How much of a served table lies on huge pages, measured from the daemon's own mapping of it.

A tmpfs gives 4 KiB pages unless it is mounted ``huge=always`` (or ``within_size``, or the
system's ``shmem_enabled`` says so), and nothing in a path tells which. So, once a generation
is ready, the daemon maps its table read-only, touches one byte per 2 MiB (a huge page is then
mapped by one PMD entry), and reads that mapping's line in ``/proc/self/smaps``:
``ShmemPmdMapped`` / ``FilePmdMapped`` are the bytes on huge pages of a tmpfs file, and a
hugetlbfs mapping is huge whole (its ``KernelPageSize``).  The mapping is dropped at once.

The result goes to the log, to ``status.huge_pages`` and to the metrics; a table of
``WARN_BYTES`` or more with less than ``WARN_COVERAGE`` of it on huge pages gets a warning with
the figures that make it matter.  Owns nothing on disk.
"""
from __future__ import annotations

import logging
import mmap
import os
import re

from ..reporting.sizes import human_bytes

log = logging.getLogger("engramd")
HUGE_STRIDE = 2 << 20
WARN_BYTES = 1 << 30
WARN_COVERAGE = 0.5
_HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ [0-9a-f]+ \S+ (\d+)")


def _smaps_fields(inode: int, smaps: str = "/proc/self/smaps") -> dict[str, int]:
    """The kB fields (as bytes) of this process's mapping of the file with ``inode``."""
    fields: dict[str, int] = {}
    inside = False
    with open(smaps) as f:
        for line in f:
            match = _HEADER.match(line)
            if match:
                if inside:
                    break
                inside = int(match.group(1)) == inode
                continue
            if inside:
                name, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
                    fields[name] = int(parts[0]) * 1024
    return fields


def measure(path: str, nbytes: int) -> dict:
    """{"bytes", "huge_bytes", "coverage", "page_bytes"} of the table file at ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        inode = os.fstat(fd).st_ino
        view = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        for offset in range(0, nbytes, HUGE_STRIDE):
            view[offset]  # a read fault maps the page (one PMD entry where the page is huge)
        fields = _smaps_fields(inode)
    finally:
        view.close()
    page = fields.get("KernelPageSize", 4096)
    if page >= HUGE_STRIDE:  # hugetlbfs: huge whole
        huge = fields.get("Size", nbytes)
    else:
        huge = fields.get("ShmemPmdMapped", 0) + fields.get("FilePmdMapped", 0)
    huge = min(huge, nbytes)
    return {"bytes": nbytes, "huge_bytes": huge, "coverage": round(huge / nbytes, 4) if nbytes else 0.0,
            "page_bytes": page if page >= HUGE_STRIDE else (HUGE_STRIDE if huge else page)}


def report(path: str, nbytes: int) -> dict | None:
    """Measure, log and, where a large table has too few huge pages, warn; None if it cannot be measured."""
    try:
        found = measure(path, nbytes)
    except OSError as exc:
        log.warning("could not measure the huge-page coverage of %s: %s", path, exc)
        return None
    share = f"{found['coverage'] * 100:.0f}%"
    log.info("table %s: %s of its %s on huge pages", path, share, human_bytes(nbytes))
    if nbytes >= WARN_BYTES and found["coverage"] < WARN_COVERAGE:
        log.warning("table %s (%s) has %s of it on huge pages: random-row gathers on the H200 machine took "
                    "6.4 ms per 393,216-row call on 4 KiB pages against 5.0 ms on a huge=always tmpfs, and "
                    "0.93 vs 0.76 ms at 49,152 rows. Put --shm-dir on a huge=always tmpfs or a hugetlbfs "
                    "(deploy/systemd/, deploy/kubernetes/README.md, \"Huge pages\")",
                    path, human_bytes(nbytes), share)
    return found
