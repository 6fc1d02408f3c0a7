"""Per-NUMA-node replicas of the table (``--numa-replicas all|NODES``): which nodes, building the
copies, checking where their pages are, and re-adopting a predecessor's set.

On a two-socket GPU node the table otherwise lives on one socket and the ranks of the other
socket's GPUs gather across the socket link.  ``all`` keeps one copy per NUMA node that has GPUs
(every node with CPUs where the machine has no GPU); ``0,1`` names them.  The first replica is
at the table's usual path (``table_path`` in attach and status: old clients map it); the others
are ``...-g<generation>-n<node>.table``.  Each costs the table's size again in the shm dir.

Building: the first replica is loaded from the checkpoint; every other one is then copied from
it, by threads pinned to the CPUs of the target node, into a file whose pages are bound to that
node before the first exists (shm/numa.py).  The copies are exactly the verified first replica,
and the checkpoint is read once.  A copy is pwrite(2) from the first replica's mapping (on
hugetlbfs, which has no write(2), a memcpy into the writer's mapping): measured on a 640 MiB
tmpfs table (two threads, the 2-core CI machine) 2.4-3.2 GB/s, against 1.5-1.6 GB/s for a memcpy
between two mappings of 4 KiB pages (every destination page faults) and 1.1-1.6 GB/s for loading
the same table again from its checkpoint, even from the page cache (a cold disk is slower still).
Every replica is checked page by page (sampled) with get_mempolicy before the set is published;
a page elsewhere fails the generation, naming the replica.  A set is published together, and
retired together (state_machine.py): a client never maps replicas of two generations.

``ENGRAMD_TEST_BIND_NODE`` (for tests only) binds every replica's memory to that real node: a fake
second node (``ENGRAM_SYSFS_ROOT``, engram_client/core/numa_nodes.py) has no memory of its own.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from engram_client.core.errors import ConfigError, EngramError, TableFileError
from engram_client.core.numa_nodes import node_cpus, parse_cpu_list, sysfs_root
from engram_client.core.variables import TEST_BIND_NODE
from engram_client.core.table_file import STATE_WRITING, TableHeader, read_header

from ..loading.loader import RateLimit
from ..reporting.sizes import human_bytes
from ..shm.numa import BoundMapping, bind_this_thread, check_node
from ..shm.table_files import ShmDir, TableWriter
from .gather_budget import gpus_by_node
from .generation import Replica

log = logging.getLogger("engramd")
TEST_BIND_ENV = TEST_BIND_NODE
COPY_CHUNK = 64 << 20
CHECK_SAMPLES = 256


def plan_nodes(spec: str, sysfs: str | None = None) -> list[int]:
    """The replicas' nodes for ``--numa-replicas spec``, checked against sysfs and the kernel."""
    sysfs = sysfs or sysfs_root()
    listed = node_cpus(sysfs)
    if spec == "all":
        nodes = sorted(gpus_by_node(sysfs)) or [node for node, cpus in listed.items() if cpus] or [0]
    else:
        nodes = parse_cpu_list(spec, "--numa-replicas", "NUMA node")
        missing = [node for node in nodes if listed and node not in listed]
        if missing:
            raise ConfigError(f"--numa-replicas {spec}: no NUMA node {missing[0]} (this machine has "
                              f"{sorted(listed)})")
    for node in nodes:
        check_node(bind_node(node), "--numa-replicas")
    return nodes


def bind_node(node: int) -> int:
    """The real node a replica's memory is bound to: its own, unless a test says otherwise."""
    forced = os.environ.get(TEST_BIND_ENV)
    return int(forced) if forced and forced.isdigit() else node


def describe(nodes: list[int]) -> str:
    return ", ".join(f"node {node}" for node in nodes)


def reserve(shm: ShmDir, header: TableHeader, node: int, first: bool) -> TableWriter:
    """A replica's file, reserved with its pages on ``node``.  The thread is bound too while
    fallocate runs: hugetlbfs keeps no per-file policy."""
    path = shm.table_path(header.generation, None if first else node)
    bind_this_thread(bind_node(node))
    try:
        return shm.create(header, path, bind_node(node))
    except EngramError as exc:
        raise type(exc)(f"replica for NUMA node {node} ({path}): {exc}") from exc
    finally:
        bind_this_thread(None)


def check_placement(bound: BoundMapping, node: int, path: str) -> None:
    """Raise naming the replica if a sampled page of it is not on its node."""
    wrong = bound.off_node(CHECK_SAMPLES)
    if wrong:
        offset, found = wrong[0]
        raise TableFileError(f"replica for NUMA node {node} ({path}): {len(wrong)} of {CHECK_SAMPLES} sampled pages "
                             f"are not on node {bound.node}, the first at offset {offset} on node {found}")


def _pin_to(node: int) -> None:
    cpus = set(node_cpus().get(node, [])) & os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, cpus)  # this thread only: the copy runs next to the memory it fills


def copy_into(writer: TableWriter, source_address: int, node: int, threads: int, cancel: threading.Event,
              max_rate: float | None = None, on_bytes: Callable[[int], None] | None = None) -> None:
    """Copy the whole table from ``source_address`` into ``writer`` on threads pinned to ``node``'s
    CPUs, then mark it unfinished again (the source may be a published replica).  ``max_rate``:
    --max-load-rate, which a copy keeps to as a load does; ``on_bytes``: told each chunk's bytes."""
    total, bound = writer.header.total_bytes, writer.bound
    pinned, limit = threading.local(), RateLimit(max_rate)

    def run(offset: int) -> None:
        nbytes = min(COPY_CHUNK, total - offset)
        limit.take(nbytes, cancel)
        if cancel.is_set():
            return
        if not getattr(pinned, "done", False):
            _pin_to(node)
            pinned.done = True
        writer.write(offset, (ctypes.c_ubyte * nbytes).from_address(source_address + offset))
        if on_bytes is not None:
            on_bytes(nbytes)
    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix=f"engramd-copy-n{node}") as pool:
        for future in [pool.submit(run, offset) for offset in range(0, total, COPY_CHUNK)]:
            future.result()
    if cancel.is_set():
        raise EngramError("load cancelled by stop")
    writer.write(0, writer.header.encode(STATE_WRITING))
    for offset in range(4096, total, max(4096, total // 64)):  # sampled: the copy holds the source's bytes
        n = min(4096, total - offset)
        if ctypes.string_at(bound.address + offset, n) != ctypes.string_at(source_address + offset, n):
            raise TableFileError(f"replica for NUMA node {node} ({writer.partial_path}): bytes at offset {offset} "
                                 "differ from the first replica's after the copy")


def build_copies(shm: ShmDir, header: TableHeader, first: TableWriter, nodes: list[int], threads: int,
                 cancel: threading.Event, max_rate: float | None = None,
                 on_bytes: Callable[[int], None] | None = None) -> list[TableWriter]:
    """Writers of the replicas for ``nodes``, filled from ``first``'s mapping, each checked where
    its pages are.  On failure every one made is abandoned."""
    writers: list[TableWriter] = []
    try:
        for node in nodes:
            started = time.monotonic()
            writer = reserve(shm, header, node, first=False)
            writers.append(writer)
            copy_into(writer, first.bound.address, node, threads, cancel, max_rate, on_bytes)
            check_placement(writer.bound, node, writer.final_path)
            elapsed = time.monotonic() - started
            log.info("replica for NUMA node %d: %s copied in %.2f s (%.2f GB/s)", node, human_bytes(header.total_bytes),
                     elapsed, header.total_bytes / max(elapsed, 1e-9) / 1e9)
    except BaseException:
        for writer in writers:
            writer.abandon()
        raise
    return writers


def publish(writers: list[tuple[int, TableWriter]]) -> list[Replica]:
    """Publish a checked set (the first replica last: its name is what a restart looks for first)."""
    replicas = [Replica(node, writer.final_path) for node, writer in writers]
    for _, writer in writers[1:] + writers[:1]:
        writer.publish()
    return replicas


def adopt(shm: ShmDir, number: int, header: TableHeader, nodes: list[int], same) -> dict[int, str]:
    """Of generation ``number``'s replica files, those complete, ``same`` as ``header`` and on their
    node: {node: path}.  Every other one is removed, said in the log; the caller rebuilds what is missing."""
    good: dict[int, str] = {}
    for index, node in enumerate(nodes):
        path = shm.table_path(number, None if index == 0 else node)
        if not os.path.lexists(path):
            log.warning("re-adoption: generation %d has no replica for NUMA node %d (%s); it is rebuilt", number,
                        node, path)
            continue
        try:
            found, _ = read_header(path)
            if not same(found, header):
                raise TableFileError("not the table to serve")
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                bound = BoundMapping(fd, found.total_bytes, bind_node(node), f"replica for NUMA node {node} ({path})")
            finally:
                os.close(fd)
            try:
                check_placement(bound, node, path)
            finally:
                bound.close()
            good[node] = path
        except (TableFileError, OSError) as exc:
            log.warning("re-adoption: not re-adopting the replica for NUMA node %d (%s): %s; it is rebuilt", node,
                        path, exc)
            shm.unlink(path)
    return good
