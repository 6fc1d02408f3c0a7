"""Placing the table's pages on NUMA nodes: one node for the whole table (``--numa-node``), or
one replica per node (``--numa-replicas``, engramd/daemon/replicas.py).

A memory policy is per thread, or per mapping: ``--numa-node`` binds the load thread before it
reserves the file, so fallocate allocates every page of the table on that node.  A replica is
bound through its mapping: ``BoundMapping`` maps the reserved-to-be file and mbind(MPOL_BIND)s
that range before any page exists.  On tmpfs that policy is the file's own (shmem keeps a shared
policy per file), so fallocate, pwrite and every later fault place pages on the node; hugetlbfs
keeps none, so the replica's load thread is bound too while fallocate runs.  After the load
``off_node`` asks get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR) where sampled pages are.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import platform

from engram_client.core.errors import ConfigError, TableFileError

MPOL_DEFAULT, MPOL_BIND = 0, 2
MPOL_F_NODE, MPOL_F_ADDR = 1, 2
MAX_NODE = 63  # one word of node mask
_SYSCALLS = {"x86_64": {"set_mempolicy": 238, "mbind": 237, "get_mempolicy": 239},
             "aarch64": {"set_mempolicy": 237, "mbind": 235, "get_mempolicy": 236}}
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.syscall.restype = ctypes.c_long
_MAP_FAILED = ctypes.c_void_p(-1).value


def _syscall(name: str, *args) -> int:
    return _libc.syscall(ctypes.c_long(_SYSCALLS[platform.machine()][name]), *args)


def present_nodes() -> list[int]:
    """The NUMA nodes of this machine's kernel (the real /sys: memory is bound there, never in a fake)."""
    if not os.path.isdir("/sys/devices/system/node"):
        return []
    return sorted(int(name[4:]) for name in os.listdir("/sys/devices/system/node")
                  if name.startswith("node") and name[4:].isdigit())


def check_node(node: int, option: str = "--numa-node") -> None:
    if node < 0 or not os.path.isdir(f"/sys/devices/system/node/node{node}"):
        raise ConfigError(f"{option} {node}: no such NUMA node (this machine has {present_nodes() or 'none listed'})")
    if node > MAX_NODE:
        raise ConfigError(f"{option} {node}: nodes above {MAX_NODE} are not supported")
    if platform.machine() not in _SYSCALLS:
        raise ConfigError(f"{option} is not supported on {platform.machine()}")


def bind_this_thread(node: int | None) -> None:
    """Allocate this thread's new pages on ``node`` only (set_mempolicy(MPOL_BIND)); None: anywhere again."""
    if node is not None and not 0 <= node <= MAX_NODE:
        raise ConfigError(f"--numa-node {node}: nodes above {MAX_NODE} are not supported")
    mask = ctypes.c_ulong(1 << node) if node is not None else None
    mode = MPOL_BIND if node is not None else MPOL_DEFAULT
    result = _syscall("set_mempolicy", mode, ctypes.byref(mask) if mask is not None else None, MAX_NODE + 2)
    if result != 0:
        err = ctypes.get_errno()
        raise ConfigError(f"set_mempolicy({'MPOL_BIND, node %d' % node if node is not None else 'MPOL_DEFAULT'}) "
                          f"failed: {os.strerror(err)}")


class BoundMapping:
    """A shared read-write mapping of ``nbytes`` of ``fd``, bound to ``node`` (mbind(MPOL_BIND)) before
    any of its pages is touched; ``what`` names the replica in errors."""

    def __init__(self, fd: int, nbytes: int, node: int, what: str):
        self.nbytes, self.node, self.what = nbytes, node, what
        address = _libc.mmap(None, nbytes, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if address in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise TableFileError(f"{what}: mmap of {nbytes} bytes failed: {os.strerror(err)}")
        self.address = address
        mask = ctypes.c_ulong(1 << node)
        if _syscall("mbind", ctypes.c_void_p(address), ctypes.c_ulong(nbytes), MPOL_BIND, ctypes.byref(mask),
                    ctypes.c_ulong(MAX_NODE + 2), 0) != 0:
            err = ctypes.get_errno()
            self.close()
            raise TableFileError(f"{what}: mbind(MPOL_BIND, node {node}) failed: {os.strerror(err)}")

    def node_of(self, offset: int) -> int:
        """The node of the page at ``offset`` (get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR); faults it in)."""
        node = ctypes.c_int(-1)
        if _syscall("get_mempolicy", ctypes.byref(node), None, ctypes.c_ulong(0),
                    ctypes.c_void_p(self.address + offset), MPOL_F_NODE | MPOL_F_ADDR) != 0:
            err = ctypes.get_errno()
            raise TableFileError(f"{self.what}: get_mempolicy at offset {offset} failed: {os.strerror(err)}")
        return node.value

    def off_node(self, samples: int = 256, page: int = 4096) -> list[tuple[int, int]]:
        """(offset, node) of sampled pages not on the replica's node: ``samples`` pages spread evenly,
        the first and last included."""
        last = max(0, (self.nbytes - 1) // page)
        offsets = sorted({min(last, round(i * last / max(1, samples - 1))) * page for i in range(samples)})
        return [(offset, found) for offset in offsets if (found := self.node_of(offset)) != self.node]

    def copy_in(self, offset: int, source_address: int, nbytes: int) -> None:
        """memcpy ``nbytes`` from ``source_address`` to ``offset`` (ctypes lets go of the GIL meanwhile)."""
        if offset < 0 or offset + nbytes > self.nbytes:
            raise TableFileError(f"{self.what}: copy to [{offset}, {offset + nbytes}) outside {self.nbytes} bytes")
        ctypes.memmove(self.address + offset, source_address, nbytes)

    def close(self) -> None:
        if self.address is not None:
            _libc.munmap(ctypes.c_void_p(self.address), self.nbytes)
            self.address = None
