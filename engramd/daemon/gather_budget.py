"""The node's gather budget, daemon side: which CPUs it has, its groups, and handing it over.

    --gather-cpus LIST | N% | off      (default: every CPU the daemon may use, less one per GPU)
    --prefill-gathers normal | idle    (idle: ranks gather prefill-size calls at SCHED_IDLE)
    --decode-cpus auto | N             (CPUs of each group kept from prefill gathers: decode_cpus.py)
    --decode-spares quiet | idle | off (spares of the prefill crews at SCHED_IDLE on those CPUs: quiet, the
                                        default, while no rank decodes; idle, whenever the CPUs are free; off, none)

The budget's CPUs are split into groups, one per NUMA node; a group's tokens are its CPUs.
The daemon creates the sealed shared memory the ranks schedule on (engram_client/core/budget_file.py)
and serves it on a unix socket beside its request socket, ``<socket>.budget``, from a thread
of its own: a connection gets the descriptor and is closed once its peer has read it, a user
at most UNREAD_PER_USER unread at once (budget_handout.py).  After that the daemon is out of
the way: ranks take and give back tokens among themselves (engram_client/lookup/host/engine/budget.h), and
keep doing so while no daemon runs.  Status reads the kernel's lock table for each group's
tokens and the counters each client reports in its heartbeats.

Owns the budget memory and the ``.budget`` socket file; the request socket belongs to server.py.
"""
from __future__ import annotations

import glob
import logging
import math
import os
import socket
import stat
import threading
from dataclasses import dataclass

from engram_client.core import budget_file
from engram_client.core.errors import ConfigError

from .budget_handout import ACCEPT_POLL_S, SEND_TIMEOUT_S, BudgetHandout
from engram_client.core.numa_nodes import format_cpu_list, parse_cpu_list  # noqa: F401 (tests import them here)

from .decode_cpus import decode_counts, decode_cpus

log = logging.getLogger("engramd.gather_budget")
# What a client may report in its heartbeat (engram_client/lookup/host/gather_seat.py): name -> type.
REPORT_FIELDS = {"slot": int, "group": int, "tokens": int, "threads": int, "cpus": str, "held": int, "rows": int,
                 "wait_s": float, "acquired": int, "yields": int, "overdraft": int, "prefill_threads": int,
                 "stand_ins": int, "spare_blocks": int, "spare_asides": int, "decode_fifo": int}
REPORT_CPUS_CHARS = 256


def check_spec(spec: str | None) -> None:
    """Refuse a malformed --gather-cpus at once (the CPUs themselves are checked at start)."""
    if spec is None or spec == "off":
        return
    if spec.endswith("%"):
        try:
            share = float(spec[:-1])
        except ValueError:
            share = -1.0
        if not 0 < share <= 100:
            raise ConfigError(f"--gather-cpus {spec!r}: a share is a percentage in (0, 100]")
        return
    parse_cpu_list(spec)


def cpu_nodes(cpus: list[int], sysfs: str = "/sys") -> dict[int, list[int]]:
    """The NUMA node of each CPU (all on node 0 where sysfs lists no nodes)."""
    nodes: dict[int, list[int]] = {}
    owner: dict[int, int] = {}
    for path in glob.glob(os.path.join(sysfs, "devices/system/node/node[0-9]*/cpulist")):
        node = int(os.path.basename(os.path.dirname(path))[4:])
        with open(path) as f:
            text = f.read().strip()
        for cpu in parse_cpu_list(text, path) if text else []:
            owner[cpu] = node
    for cpu in cpus:
        nodes.setdefault(owner.get(cpu, 0), []).append(cpu)
    return dict(sorted(nodes.items()))


def gpus_by_node(sysfs: str = "/sys") -> dict[int, int]:
    """NVIDIA GPUs (PCI vendor 0x10de, display or 3D class) per NUMA node, from sysfs."""
    found: dict[int, int] = {}
    for device in glob.glob(os.path.join(sysfs, "bus/pci/devices/*")):
        try:
            with open(os.path.join(device, "vendor")) as f:
                vendor = f.read().strip()
            with open(os.path.join(device, "class")) as f:
                klass = f.read().strip()
        except OSError:
            continue
        if vendor != "0x10de" or not klass.startswith(("0x0300", "0x0302")):
            continue
        try:
            with open(os.path.join(device, "numa_node")) as f:
                node = max(0, int(f.read().strip()))
        except (OSError, ValueError):
            node = 0
        found[node] = found.get(node, 0) + 1
    return found


@dataclass(frozen=True)
class BudgetGroup:
    node: int
    cpus: tuple[int, ...]


def plan_groups(spec: str | None, sysfs: str = "/sys", allowed: list[int] | None = None) -> list[BudgetGroup]:
    """The budget's groups for --gather-cpus ``spec`` ([] for 'off').

    Default: every CPU the daemon may run on, less one per GPU on each NUMA node (one if the
    node has no GPU but the machine has none at all), so that each rank's own thread keeps a
    core: on the H200 machine (16 vCPUs, one GPU) that is 15, the pool that gathered 72.7 M
    rows/s alone (docs/history/benchmarks-2026-12.md, "Many ranks on one node")."""
    if spec == "off":
        return []
    allowed = sorted(os.sched_getaffinity(0)) if allowed is None else sorted(allowed)
    if spec is not None and not spec.endswith("%"):
        cpus = parse_cpu_list(spec)
        outside = sorted(set(cpus) - set(allowed))
        if outside:
            raise ConfigError(f"--gather-cpus {spec}: CPUs {format_cpu_list(outside)} are not among the CPUs this "
                              f"daemon may use ({format_cpu_list(allowed)})")
        return [BudgetGroup(node, tuple(c)) for node, c in cpu_nodes(cpus, sysfs).items()]
    nodes = cpu_nodes(allowed, sysfs)
    groups = []
    if spec is None:
        gpus = gpus_by_node(sysfs)
        for node, cpus in nodes.items():
            reserve = gpus.get(node, 0) or (1 if not gpus and node == max(nodes) else 0)
            kept = cpus[:max(1, len(cpus) - reserve)]
            groups.append(BudgetGroup(node, tuple(kept)))
    else:
        share = float(spec[:-1]) / 100
        groups = [BudgetGroup(node, tuple(cpus[:max(1, math.floor(len(cpus) * share + 1e-9))]))
                  for node, cpus in nodes.items()]
    if len(groups) > budget_file.MAX_GROUPS:
        raise ConfigError(f"the budget's CPUs lie on {len(groups)} NUMA nodes; at most {budget_file.MAX_GROUPS}")
    return groups


def client_report(value) -> dict | None:
    """A heartbeat's ``budget`` counters, checked: known names, right types, bounded (None if absent)."""
    from engram_client.core.errors import ProtocolError

    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > len(REPORT_FIELDS):
        raise ProtocolError("argument 'budget' must be a map of the budget counters")
    report = {}
    for name, item in value.items():
        kind = REPORT_FIELDS.get(name)
        if kind is None:
            raise ProtocolError(f"argument 'budget' has an unknown field {str(name)[:32]!r}")
        if kind is float and isinstance(item, int) and not isinstance(item, bool):
            item = float(item)
        if isinstance(item, bool) or not isinstance(item, kind):
            raise ProtocolError(f"budget field {name!r} must be {kind.__name__}")
        if kind is str and len(item) > REPORT_CPUS_CHARS:
            raise ProtocolError(f"budget field {name!r} is longer than {REPORT_CPUS_CHARS} characters")
        if kind in (int, float) and not 0 <= item < 2**63:
            raise ProtocolError(f"budget field {name!r} must be between 0 and 2**63, got {item!r}")
        report[name] = item
    return report


class GatherBudget:
    """The budget memory and its socket; created by the server once the request socket is bound."""

    def __init__(self, groups: list[BudgetGroup], socket_path: str, gid: int | None, budget_id: str,
                 prefill_gathers: str = "normal", decode: str = "auto", decode_spares: str = "quiet"):
        self.groups, self.socket_path, self.id = groups, socket_path, budget_id
        self.prefill_gathers, self.decode_spares = prefill_gathers, decode_spares
        self.decode = decode_counts([len(g.cpus) for g in groups], decode, prefill_gathers)
        flags = budget_file.PREFILL_GATHERS[prefill_gathers] | budget_file.DECODE_SPARES[decode_spares]
        self.fd = budget_file.create([len(g.cpus) for g in groups], flags=flags, decode=self.decode)
        self.view = budget_file.BudgetView(self.fd)
        self._closed = threading.Event()
        self.listener = None
        try:
            self.listener = self._bind(gid)
        except BaseException:
            self.close()
            raise
        self.handout = BudgetHandout(self.listener, self.fd, self._closed)
        self.thread = threading.Thread(target=self.handout.serve, name="engramd-gather-budget", daemon=True)
        self.thread.start()
        log.info("gather budget: %s, handed to ranks on %s", self.summary(), socket_path)

    def _bind(self, gid: int | None) -> socket.socket:
        try:
            info = os.lstat(self.socket_path)
            # The request socket's lock is ours, so a socket left here is our dead predecessor's.
            if stat.S_ISSOCK(info.st_mode) and info.st_uid == os.geteuid():
                os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o077)
        try:
            sock.bind(self.socket_path)
        except OSError as exc:
            sock.close()
            raise ConfigError(f"cannot bind the gather budget's socket {self.socket_path}: {exc.strerror}") from exc
        finally:
            os.umask(old)
        if gid is not None:
            os.chown(self.socket_path, -1, gid)
        os.chmod(self.socket_path, 0o660 if gid is not None else 0o600)
        sock.listen(64)
        sock.settimeout(ACCEPT_POLL_S)
        return sock

    def summary(self) -> str:
        groups = "; ".join(f"NUMA node {g.node}: {len(g.cpus)} tokens on CPUs {format_cpu_list(list(g.cpus))}"
                           + (f", decode CPUs {format_cpu_list(decode_cpus(g.cpus, d))}" if d else "")
                           for g, d in zip(self.groups, self.decode))
        return groups + ("; prefill-size calls gathered at SCHED_IDLE" if self.prefill_gathers == "idle" else "") + \
            ("; no spares on the decode CPUs" if any(self.decode) and self.decode_spares == "off" else "")

    def describe(self) -> dict:
        """What an attach reply says about the budget (docs/protocol.md, 1.3)."""
        return {"socket": self.socket_path, "id": self.id, "version": budget_file.VERSION,
                "slots": self.view.slots, "small_rows": budget_file.SMALL_ROWS,
                "groups": [{"group": i, "node": g.node, "cpus": list(g.cpus), "tokens": len(g.cpus),
                            "decode_tokens": d} for i, (g, d) in enumerate(zip(self.groups, self.decode))]}

    def status(self) -> dict:
        """The budget for status: each group's tokens, CPUs, and what the kernel and the ranks say of it."""
        groups = []
        for i, g in enumerate(self.groups):
            seen = self.view.group(i)
            groups.append({"group": i, "node": g.node, "cpus": format_cpu_list(list(g.cpus)), "tokens": len(g.cpus),
                           "locked": seen["locked"], "peak_gathering": seen["peak"], "grants": seen["grants"],
                           "dead_slots_swept": seen["sweeps"], "decode_tokens": self.decode[i],
                           "decode_cpus": format_cpu_list(decode_cpus(g.cpus, self.decode[i])),
                           "decoding": seen["decoding"]})
        return {"id": self.id, "socket": self.socket_path, "groups": groups,
                "tokens": sum(len(g.cpus) for g in self.groups), "prefill_gathers": self.prefill_gathers,
                "decode_spares": self.decode_spares}

    def close(self) -> None:
        self._closed.set()
        if self.listener is not None:
            self.listener.close()
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
            self.listener = None
        if getattr(self, "thread", None) is not None:
            self.thread.join(timeout=2 * ACCEPT_POLL_S + SEND_TIMEOUT_S)
        self.view.close()
        os.close(self.fd)  # ranks that hold it keep it: the memory lives while one does


def serve_budget(config, boot_id: str) -> "GatherBudget | None":
    """The node's gather budget for a daemon of ``config``, served beside its request socket (ipc
    endpoints only); None where there is none (--gather-cpus off, or not an ipc endpoint)."""
    from engram_client.core import endpoints

    groups = config.budget_groups
    path = endpoints.ipc_path(config.endpoint)
    if not groups or path is None:
        log.info("no gather budget (%s): each rank sizes its own pool",
                 "--gather-cpus off" if not groups else "not an ipc endpoint")
        return None
    return GatherBudget(groups, path + ".budget", config.gid, boot_id, config.prefill_gathers, config.decode_cpus,
                        config.decode_spares)
