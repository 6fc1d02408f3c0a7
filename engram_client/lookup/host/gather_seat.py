"""A rank's seat on the node's gather budget: its group, its CPUs, its pool, and what it is told.

The attach reply (protocol 1.3) describes the budget engramd hands out: groups of CPUs, one per
NUMA node, each a number of tokens.  A rank takes the group of its GPU's NUMA node (from the
GPU's PCI address in sysfs; a CPU rank, or a GPU sysfs does not place, takes the group holding
most of the CPUs it may run on), receives the budget's memory (engram_client/core/budget_file.py)
and starts its pool on it: its workers are pinned to the group's CPUs and gather only while
they hold a token (engram_client/lookup/host/engine/budget.h).  By default the pool has as many threads as
the group has tokens, so a rank alone may use all of them.

``gather_threads`` given by the caller still sizes the pool; the seat says in words what that
means beside the budget.  Without a budget (a daemon run with --gather-cpus off, or one older
than 1.3) the pool is sized as before, alone.  Without a seat on a budget the daemon has (every
slot locked, or its memory could not be had: a peer of the daemon's group can do either) the
pool gathers beside it on the share of one slot, pinned to the group's CPUs, and says so in its
words, its log and its heartbeats (a report without ``slot``): ranks kept off their seats never
oversubscribe the CPUs the budget shares.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from ...core import budget_file
from ...core.errors import ConfigError, EngramError
from ...core.numa_nodes import cpu_rank_node, sysfs_root

log = logging.getLogger("engram_client")
MAX_BUDGET_THREADS = 64  # threads beyond this only wait for tokens: a rank never needs more in flight
# The workers' SCHED_FIFO priority for decode_priority="fifo": the lowest, above every thread of normal
# priority and below the kernel's threaded interrupt handlers (50).
DECODE_FIFO_PRIORITY = 1


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def format_cpus(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    parts, start, prev = [], None, None
    for cpu in sorted(cpus) + [None]:
        if start is not None and cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            parts.append(f"{start}-{prev}" if prev != start else str(start))
        start = prev = cpu
    return ",".join(parts)


def gpu_numa_node(device, sysfs: str = "/sys") -> int | None:
    """The NUMA node of a CUDA device's PCI function, or None where sysfs does not say."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    props = torch.cuda.get_device_properties(torch.device(device))
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return None
    address = f"{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"
    try:
        with open(os.path.join(sysfs, "bus/pci/devices", address, "numa_node")) as f:
            node = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def rank_node(device, sysfs: str | None = None) -> int | None:
    """This rank's NUMA node: its GPU's; for a CPU rank (or a GPU sysfs does not place) the node of
    most of the CPUs it may run on; None where sysfs lists no nodes (core/numa_nodes.py)."""
    sysfs = sysfs or sysfs_root()
    node = gpu_numa_node(device, sysfs)
    return node if node is not None else cpu_rank_node(os.sched_getaffinity(0), sysfs)


def choose_group(groups: list[dict], gpu_node: int | None, allowed: set[int]) -> dict:
    """The GPU's node's group; else the group with most of the CPUs this process may use."""
    for group in groups:
        if gpu_node is not None and group["node"] == gpu_node:
            return group
    return max(groups, key=lambda g: (len(allowed & set(g["cpus"])), -g["group"]))


@dataclass
class GatherSeat:
    threads: int
    words: str  # what the seat means for this rank's pool (take_seat); `explanation` adds the prefill rule's
    budget: Any = None  # _host_gather.NodeBudget, or None: the pool sizes itself alone
    group: dict = field(default_factory=dict)
    cpus: list[int] | None = None  # where the workers are pinned
    budget_id: str | None = None
    pool: Any = None  # the pool open_pool started on this seat
    prefill_words: str = ""  # what the daemon's --prefill-gathers rule means for the pool, once it is open
    seatless: bool = False  # the daemon has a budget, but this rank has no seat on it (take_seat)
    realtime_asked: bool = False  # open_pool's realtime: decode_priority "fifo"

    @property
    def explanation(self) -> str:
        return self.words + self.prefill_words

    def report(self, daemon_version: tuple[int, int] | None = None) -> dict | None:
        """The counters a heartbeat carries (engramd/daemon/gather_budget.py checks them), those the daemon
        knows: ``daemon_version`` is the protocol version of its replies."""
        if self.budget is None:  # without a seat: what the pool is, and no slot (status says "no seat")
            return {"group": self.group["group"], "tokens": self.group["tokens"], "threads": self.threads,
                    "cpus": format_cpus(self.cpus or self.group["cpus"])} if self.seatless else None
        stats = self.budget.stats()

        def sane(value):  # counters live in shared memory a peer may scribble on: report them bounded
            return min(max(value, 0), 2**62)
        report = {"slot": stats["slot"], "group": stats["group"], "tokens": stats["tokens"], "threads": self.threads,
                  "cpus": format_cpus(self.cpus or self.group.get("cpus", [])), "held": sane(stats["held"]),
                  "rows": sane(stats["rows"]), "wait_s": round(float(sane(stats["wait_s"])), 6),
                  "acquired": sane(stats["acquired"]), "yields": sane(stats["yields"]),
                  "overdraft": sane(stats["overdraft"])}
        if self.budget.prefill_idle and self.pool is not None:  # only a 1.5 daemon sets the rule, and knows the field
            report["prefill_threads"] = self.pool.prefill_crew[0]
        if daemon_version is not None and daemon_version >= (1, 6):
            report["stand_ins"] = sane(stats["stand_ins"])
        if daemon_version is not None and daemon_version >= (1, 9) and self.pool is not None:
            blocks, asides = self.pool.spare_counts
            report["spare_blocks"], report["spare_asides"] = sane(blocks), sane(asides)
        if daemon_version is not None and daemon_version >= (1, 10) and self.pool is not None:
            report["decode_fifo"] = self.pool.decode_priority[0]
        return report

    def open_pool(self, signalled: bool = False, realtime: bool = False):
        """The pool on this seat.  Where stream memory operations signal the workers (host_signal.py)
        no host function lends its thread to the gather, so the pool starts ``threads`` workers.
        ``realtime``: its workers gather at SCHED_FIFO while a crew takes the prefill-size calls
        (engine/crew.c, workers_realtime); where the kernel refuses it, ConfigError says why and how
        to allow it (after a move to another daemon's budget it is only said: _say_prefill_crew)."""
        from .host_lookup import _host_gather

        pool = _host_gather.GatherPool(self.threads, caller_gathers=not signalled, budget=self.budget,
                                       cpus=self.cpus, decode_priority=DECODE_FIFO_PRIORITY if realtime else 0)
        if realtime and pool.decode_priority[1]:
            words = self.realtime_refusal(pool.decode_priority[1])
            pool.close()
            raise ConfigError(words)
        self.pool, self.realtime_asked = pool, realtime
        self._say_prefill_crew()
        return self.pool

    def _say_prefill_crew(self) -> None:
        """Say what the daemon's --prefill-gathers and --decode-cpus rules mean for this pool (again
        after a move to another daemon's budget)."""
        self.prefill_words = ""
        if self.budget is not None and not self.budget.prefill_idle and self.budget.decode_tokens:
            self.prefill_words = self._decode_cpu_words()
        if self.budget is not None and self.budget.prefill_idle:
            threads, error = self.pool.prefill_crew
            if threads:
                self.prefill_words = (f"; its prefill-size calls (over {self.budget.small_rows:,} rows) are gathered by "
                                      f"{_n(threads, 'thread')} at SCHED_IDLE (the daemon's --prefill-gathers idle), "
                                      "which use a CPU only where no thread of normal priority wants it")
            else:
                words = (f"the daemon asks for prefill-size calls to be gathered at SCHED_IDLE (--prefill-gathers "
                         f"idle), but this process may not start threads at that policy ({os.strerror(error)}): its "
                         "prefill gathers at normal priority, and decode-size lookups beside it wait for CPUs")
                log.warning("engram_client: %s", words)
                self.prefill_words = "; " + words
        if self.budget is not None and self.realtime_asked:
            self.prefill_words += self._decode_priority_words()

    def _decode_priority_words(self) -> str:
        """What decode_priority="fifo" came to for this pool's workers."""
        priority, error = self.pool.decode_priority
        if priority:
            return (f"; its workers gather decode-size calls at SCHED_FIFO {priority} (decode_priority='fifo'), taking a "
                    "CPU from any prefill gather the moment they wake, so the decode CPUs' spares need not stand "
                    "aside for them")
        if not error:
            return ("; decode_priority='fifo' asks for its workers at SCHED_FIFO, but they may take prefill-size calls "
                    "on this budget (no prefill crew), so they stay at normal priority")
        words = self.realtime_refusal(error)
        log.warning("engram_client: %s", words)
        return "; " + words

    @staticmethod
    def realtime_refusal(error: int) -> str:
        """Why the workers could not go to SCHED_FIFO (the errno), and how to allow it."""
        return (f"decode_priority='fifo': this process may not run threads at SCHED_FIFO ({os.strerror(error)}), so "
                "its decode-size calls would be gathered at normal priority; give the engine CAP_SYS_NICE or a "
                f"real-time priority limit of {DECODE_FIFO_PRIORITY} or more (systemd "
                f"LimitRTPRIO={DECODE_FIFO_PRIORITY}, docker --ulimit rtprio={DECODE_FIFO_PRIORITY}), or leave "
                "decode_priority at 'normal'")

    def _decode_cpu_words(self) -> str:
        """What the daemon's decode CPUs (--decode-cpus) mean for this pool."""
        decode = self.budget.decode_tokens
        threads, error = self.pool.prefill_crew
        spares, cpus = self.pool.prefill_spares
        if threads:
            there = f"{_n(spares, 'spare')} at SCHED_IDLE there" if spares else "no spares there (--decode-spares off)"
            if spares and self.budget.spares_quiet:
                there += ", standing aside while a rank of the group decodes (--decode-spares quiet)"
            return (f"; {_n(decode, 'token')} of the group kept for decode-size calls (--decode-cpus): its "
                    f"prefill-size calls are gathered by {_n(threads, 'thread')} kept off the decode CPUs "
                    f"{format_cpus(cpus)}, with {there}")
        if error:
            log.warning("engram_client: this process may not start the prefill crew's spares at SCHED_IDLE (%s): its "
                        "prefill gathers also run on the decode CPUs", os.strerror(error))
        why = os.strerror(error) if error else "its workers are not pinned, or pinned to too few CPUs"
        return (f"; {_n(decode, 'token')} of the group kept for decode-size calls (--decode-cpus), but this pool's "
                f"prefill-size calls run on every CPU it is pinned to ({why})")


def _open_budget(spec: dict, group: dict, timeout: float):
    from .host_lookup import _host_gather  # host_lookup gives the C module the project's error classes

    fd = budget_file.receive(spec["socket"], timeout)
    try:  # as the daemon announced it: the budget's header is memory every rank may write
        return _host_gather.NodeBudget(fd, group["group"], group["tokens"], spec["slots"],
                                       small_rows=spec.get("small_rows", 0), decode=group.get("decode_tokens", -1))
    finally:
        os.close(fd)


def take_seat(spec: dict | None, device, requested: int | None, alone_default: int, timeout: float = 5.0,
              sysfs: str = "/sys") -> GatherSeat:
    """The seat for one client: ``spec`` is the attach reply's ``budget`` (None: no budget),
    ``requested`` the caller's gather_threads (None: the budget decides), ``alone_default`` the pool a
    rank would size for itself."""
    if not spec or spec.get("version") != budget_file.VERSION or not spec.get("groups"):
        threads = alone_default if requested is None else requested
        why = "no node gather budget (the daemon has none, or gather_budget=False)" if not spec else \
            "the daemon's gather budget is of another version"
        return GatherSeat(threads, f"{why}: this rank's pool has {threads} gather threads of its own, "
                                   "sized without regard to other ranks")
    allowed = os.sched_getaffinity(0)
    group = choose_group(spec["groups"], gpu_numa_node(device, sysfs), allowed)
    try:
        budget = _open_budget(spec, group, timeout)
    except EngramError as exc:
        return _seatless(spec, group, requested, allowed, exc)
    tokens = group["tokens"]
    threads = min(tokens, MAX_BUDGET_THREADS) if requested is None else requested
    cpus = sorted(allowed & set(group["cpus"])) or None
    where = f"group {group['group']} (NUMA node {group['node']}, CPUs {format_cpus(group['cpus'])})"
    pinned = "" if cpus else "; none of those CPUs is open to this process, so its workers are not pinned"
    if requested is None:
        words = (f"gathers on the node's budget: {where}, {_n(tokens, 'token')} shared by every rank; this rank's pool has "
                 f"{_n(threads, 'thread')}, so alone it may use {_n(min(threads, tokens), 'token')}, and beside busy ranks its "
                 f"fair share{pinned}")
    else:
        words = (f"gather_threads={requested}: this rank's pool has {requested} threads, and they gather only while "
                 f"holding tokens of the node's budget ({where}, {_n(tokens, 'token')} shared by every rank): it runs at "
                 f"most {min(requested, tokens)} at once, and beside busy ranks its fair share; "
                 + ("threads beyond the tokens only wait" if requested > tokens else
                    "leave gather_threads unset to let a rank alone use every token") + pinned)
        log.warning("engram_client: %s", words)
    return GatherSeat(threads, words, budget, group, cpus, spec.get("id"))


def _seatless(spec: dict, group: dict, requested: int | None, allowed: set[int], exc: EngramError) -> GatherSeat:
    """No seat on the daemon's budget: a pool beside it, of the share one slot has of the group's
    tokens (at least 1), pinned to the group's CPUs."""
    slots = max(1, spec.get("slots") or 1)
    share = max(1, -(-group["tokens"] // slots))
    threads = share if requested is None else min(requested, share)
    cpus = sorted(allowed & set(group["cpus"])) or None
    words = (f"no seat on the node's gather budget ({exc}): this rank gathers beside it on {_n(threads, 'thread')} "
             f"of its own, the share of one of its {slots} slots in group {group['group']} (CPUs "
             f"{format_cpus(group['cpus'])}, {_n(group['tokens'], 'token')})"
             + (f", not the {requested} gather_threads asks for" if requested is not None and requested > share else ""))
    log.warning("engram_client: %s", words)
    return GatherSeat(threads, words, None, group, cpus, spec.get("id"), seatless=True)


def move_seat(seat: GatherSeat, pool, spec: dict | None, device, timeout: float = 5.0) -> None:
    """After a re-attach to another daemon: move the pool to its budget (a new one each boot)."""
    if seat.budget is None or not spec or spec.get("id") == seat.budget_id or spec.get("version") != budget_file.VERSION:
        return
    group = choose_group(spec["groups"], gpu_numa_node(device), os.sched_getaffinity(0))
    if group["tokens"] != seat.group.get("tokens"):
        log.info("the new daemon's gather budget has %d tokens in this rank's group, not %d; the pool keeps its %d "
                 "threads", group["tokens"], seat.group.get("tokens"), seat.threads)
    try:
        budget = _open_budget(spec, group, timeout)
    except EngramError as exc:
        log.warning("could not move to the new daemon's gather budget (%s); gathering on the old one", exc)
        return
    if pool.set_budget(budget):
        seat.budget, seat.group, seat.budget_id = budget, group, spec.get("id")
        log.info("moved to the new daemon's gather budget (slot %d)", budget.slot)
        seat.pool = pool
        seat._say_prefill_crew()
