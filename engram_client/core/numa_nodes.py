"""NUMA nodes as sysfs lists them, and which table replica a rank maps (both sides share this).

With ``engramd serve --numa-replicas`` the daemon keeps one copy of the table per NUMA node
(engramd/daemon/replicas.py); the attach reply lists them (protocol 1.4) as ``replicas``:
``[{"node": N, "path": P}, ...]``, the first one at ``table_path``.  A rank maps the replica
of its own node (``pick_replica``): a GPU rank's node is its GPU's (from the GPU's PCI address,
engram_client/lookup/host/gather_seat.py), a CPU rank's the node holding most of the CPUs it may
run on (``cpu_rank_node``).  A rank whose node has no replica maps the first.

``ENGRAM_SYSFS_ROOT`` (default ``/sys``) moves the sysfs root that the replica planning of the
daemon and the node choice of a client read.  It is for tests: a machine with one NUMA node can
only fake a second one (a temporary directory holding ``devices/system/node/nodeN/cpulist`` and
``bus/pci/devices/<address>/numa_node`` files).
"""
from __future__ import annotations

import glob
import os

from .errors import ConfigError, ProtocolError

SYSFS_ENV = "ENGRAM_SYSFS_ROOT"


def sysfs_root() -> str:
    return os.environ.get(SYSFS_ENV) or "/sys"


def parse_cpu_list(text: str, what: str = "--gather-cpus", unit: str = "CPU") -> list[int]:
    """'0-7,16,18-19' -> [0..7, 16, 18, 19]; anything else raises naming the bad part.
    ``unit`` says what the numbers are (``NUMA node`` for --numa-replicas' list of nodes)."""
    cpus: set[int] = set()
    for part in text.split(","):
        bounds = part.strip().split("-")
        if not part.strip() or len(bounds) > 2 or not all(b.strip().isdigit() for b in bounds):
            example = "0-7" if unit == "CPU" else "0-1"
            raise ConfigError(f"{what} {text!r}: {part!r} is not a {unit} number or a range like {example}")
        lo, hi = int(bounds[0]), int(bounds[-1])
        if hi < lo or hi > 4095:
            raise ConfigError(f"{what} {text!r}: range {part!r} is empty or beyond {unit} 4095")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def format_cpu_list(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    parts, run = [], []
    for cpu in sorted(cpus):
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [cpu]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


def node_cpus(sysfs: str | None = None) -> dict[int, list[int]]:
    """Every NUMA node sysfs lists, with its CPUs ({} where it lists none)."""
    nodes: dict[int, list[int]] = {}
    for path in glob.glob(os.path.join(sysfs or sysfs_root(), "devices/system/node/node[0-9]*/cpulist")):
        name = os.path.basename(os.path.dirname(path))[4:]
        if not name.isdigit():
            continue
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        nodes[int(name)] = parse_cpu_list(text, path) if text else []
    return dict(sorted(nodes.items()))


def cpu_rank_node(allowed: set[int], sysfs: str | None = None) -> int | None:
    """The node holding most of the CPUs in ``allowed`` (the lowest on a tie); None where sysfs lists none."""
    nodes = node_cpus(sysfs)
    if not nodes:
        return None
    return max(nodes, key=lambda node: (len(allowed & set(nodes[node])), -node))


def check_replicas(replicas, table_path: str) -> list[dict]:
    """The attach reply's replica list, checked (an older daemon sends none: one replica at ``table_path``)."""
    if replicas is None:
        return [{"node": None, "path": table_path}]
    if not isinstance(replicas, list) or not replicas or not all(
            isinstance(r, dict) and isinstance(r.get("path"), str) and
            (r.get("node") is None or (isinstance(r.get("node"), int) and not isinstance(r.get("node"), bool)))
            for r in replicas):
        raise ProtocolError(f"the daemon's replica list is malformed: {replicas!r:.200}")
    return [{"node": r.get("node"), "path": r["path"]} for r in replicas]


def pick_replica(replicas, table_path: str, node: int | None) -> dict:
    """{"node", "path"} of the replica a rank on NUMA node ``node`` maps: its node's, else the first."""
    checked = check_replicas(replicas, table_path)
    for replica in checked:
        if node is not None and replica["node"] == node:
            return replica
    return checked[0]
