"""Placing the table's pages on one NUMA node (the one nearest the GPUs' PCIe root).

A memory policy is per thread: the load thread binds itself before it reserves the
file, so fallocate allocates every page of the table on that node, and the copy
threads (which only fill pages already there) need no policy.
"""
from __future__ import annotations

import ctypes
import os
import platform

from engram_client.core.errors import ConfigError

MPOL_BIND = 2
_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}
_libc = ctypes.CDLL(None, use_errno=True)


def check_node(node: int) -> None:
    if node < 0 or not os.path.isdir(f"/sys/devices/system/node/node{node}"):
        present = sorted(int(name[4:]) for name in os.listdir("/sys/devices/system/node")
                         if name.startswith("node") and name[4:].isdigit()) \
            if os.path.isdir("/sys/devices/system/node") else []
        raise ConfigError(f"--numa-node {node}: no such NUMA node (this machine has {present or 'none listed'})")
    if platform.machine() not in _SET_MEMPOLICY:
        raise ConfigError(f"--numa-node is not supported on {platform.machine()}")


def bind_this_thread(node: int) -> None:
    """Allocate this thread's new pages on ``node`` only (set_mempolicy(MPOL_BIND))."""
    mask = ctypes.c_ulong(1 << node) if node < 64 else None
    if mask is None:
        raise ConfigError(f"--numa-node {node}: nodes above 63 are not supported")
    result = _libc.syscall(_SET_MEMPOLICY[platform.machine()], MPOL_BIND, ctypes.byref(mask), 64 + 1)
    if result != 0:
        err = ctypes.get_errno()
        raise ConfigError(f"set_mempolicy(MPOL_BIND, node {node}) failed: {os.strerror(err)}")
