"""Busy neighbours for the engine-level benchmark and the lookup probe: other rank processes on
the host looping prefill-size lookups on the same table (ranks of other GPUs, as far as this
host is concerned), the rows they gathered within a span of the rank's time (each call's start and end
on the clock the rank reads), and what the node's budget says meanwhile."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from benchmarks.common import on_cpu_ns_by_thread

# The daemon's budget rules the busy-node benchmarks compare (engine/busy_rules.py, node/lone_rules.py)
RULES = {  # name -> the daemon's serve options
    "default": "",
    "spares-idle": "--decode-spares idle",   # the default before quiet spares: they gather beside decodes too
    "decode-0": "--decode-cpus 0",           # the budget before decode CPUs
    "decode-2": "--decode-cpus 2",           # the default before one per 4 tokens
    "decode-4": "--decode-cpus 4",           # the default before two per 5 tokens (one per 4: 4 of 15)
    "decode-8": "--decode-cpus 8",           # the operator's row for a tighter decode tail (about half of 15)
    "spares-off": "--decode-spares off",
    "idle": "--prefill-gathers idle",
    "gpu-decode": "--decode-cpus 0",         # with the ranks' decode-size calls on the UVA kernel (DECODE_PATHS)
    "gpu-decode-cpus": "",                   # the same ranks on the default budget: its decode CPUs unused by them
    "fifo-decode": "",                       # the default budget, the rank's workers at SCHED_FIFO (DECODE_PRIORITIES)
}
# The rules whose decoding rank asks for a decode path (EngramClient(decode_path=...), the engines'
# ENGRAMD_DECODE_PATH); every other rule's rank takes the host path for every call.
DECODE_PATHS = {"gpu-decode": "uva", "gpu-decode-cpus": "uva"}
# The rules whose decoding rank asks for a decode priority (EngramClient(decode_priority=...), the engines'
# ENGRAMD_DECODE_PRIORITY); every other rule's rank has the default, "normal".
DECODE_PRIORITIES = {"fifo-decode": "fifo"}


def rule_words(rule: str) -> str:
    """A rule as a table names it: the daemon's serve options, and the rank's decode path and priority
    where it asks one."""
    words = f"`{RULES[rule] or '(none)'}`"
    words += f", decode_path `{DECODE_PATHS[rule]}`" if rule in DECODE_PATHS else ""
    return words + (f", decode_priority `{DECODE_PRIORITIES[rule]}`" if rule in DECODE_PRIORITIES else "")
POLICIES = ("normal", "batch", "idle")  # a neighbour's CPU scheduling policy: SCHED_OTHER, _BATCH, _IDLE
# Prepended to a neighbour's script; called before its pool starts, whose threads inherit the policy.
SET_POLICY = """
import os
def set_policy(name):
    if name != "normal":
        os.sched_setscheduler(0, {"batch": os.SCHED_BATCH, "idle": os.SCHED_IDLE}[name], os.sched_param(0))
"""
NEIGHBOUR = SET_POLICY + """
import json, select, sys, time, torch
from engram_client import EngramClient
set_policy(sys.argv[3])
client = EngramClient(endpoint=sys.argv[1], device="cpu", timeout=600)
table = client.table(client.layers[0])
gen = torch.Generator().manual_seed(int(sys.argv[2]))
ids = [torch.randint(0, table.num_rows, (393216,), generator=gen) for _ in range(4)]
for warm in ids:
    table._host.gather_rows(table, warm)
print("ready", flush=True)
spans, wall, cpu, caller_cpu = [], time.monotonic(), time.process_time(), time.thread_time()
while not select.select([sys.stdin], [], [], 0)[0]:
    began = time.monotonic()  # CLOCK_MONOTONIC: the rank's decode windows are read on the same clock
    table._host.gather_rows(table, ids[len(spans) % 4])  # the CPU half of a host-path lookup
    spans.append([round(began, 6), round(time.monotonic(), 6)])
wall, cpu, caller_cpu = time.monotonic() - wall, time.process_time() - cpu, time.thread_time() - caller_cpu
rows = ids[0].numel()
print(json.dumps({"calls": len(spans), "m_rows_per_s": round(len(spans) * rows / wall / 1e6, 2), "cores": cpu / wall,
                  "caller_cores": caller_cpu / wall, "rows_per_call": rows, "spans": spans}), flush=True)
"""
REPORT = ("calls", "m_rows_per_s", "cores", "caller_cores", "rows_per_call", "spans")


def start_neighbours(endpoint: str, count: int, policy: str = "normal") -> list[subprocess.Popen]:
    if policy not in POLICIES:
        raise ValueError(f"neighbour policy {policy!r}: want one of {', '.join(POLICIES)}")
    env = dict(os.environ, OMP_NUM_THREADS="1")  # their torch ops made the ids before "ready"
    procs = [subprocess.Popen([sys.executable, "-c", NEIGHBOUR, endpoint, str(i), policy], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env) for i in range(count)]
    for proc in procs:
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit("a busy neighbour did not start")
    return procs


def stop_neighbours(procs) -> list[dict]:
    """Each neighbour's calls, its prefill rate, the cores it used (in all, and its waiting caller's
    alone), and each call's rows and [start, end] on CLOCK_MONOTONIC (rows_per_s_within reads them)."""
    reports = []
    for proc in procs:
        out, _ = proc.communicate("", timeout=120)
        lines = out.strip().splitlines()
        try:
            report = json.loads(lines[-1])
            reports.append({key: report[key] for key in REPORT})
        except (IndexError, ValueError, TypeError, KeyError):
            raise SystemExit(f"a busy neighbour (pid {proc.pid}, rc {proc.returncode}) ended without its report: "
                             f"{out[-500:]!r}") from None
    return reports


def rows_per_s_within(spans, rows_per_call: int, windows) -> float | None:
    """One neighbour's rows/s within ``windows`` (disjoint [start, end] pairs): each call counts its rows
    times the share of its time inside them, a call across a window's edge in part; None without windows."""
    total = sum(end - start for start, end in windows or ())
    if total <= 0:
        return None
    rows = 0.0
    for began, ended in spans:
        inside = sum(max(0.0, min(ended, end) - max(began, start)) for start, end in windows)
        if ended > began:
            rows += rows_per_call * inside / (ended - began)
        elif any(start <= began <= end for start, end in windows):  # a call shorter than the report's microsecond
            rows += rows_per_call
    return rows / total


def counted_within(reports: list[dict], windows) -> list[dict]:
    """The reports with each call's span replaced by the neighbour's M rows/s within ``windows``
    (``m_rows_per_s_within``; None without windows): a results file keeps the figure, not every call."""
    def counted(report: dict) -> dict:
        rate = rows_per_s_within(report["spans"], report["rows_per_call"], windows)
        return {**{k: v for k, v in report.items() if k != "spans"},
                "m_rows_per_s_within": None if rate is None else round(rate / 1e6, 2)}
    return [counted(report) for report in reports]


class CoresWithin:
    """The CPU the neighbours' threads used within spans of the rank's time (its decode runs), by thread
    name: which of their threads gathered while the rank decoded (the crews', the spares' on the decode
    CPUs, their callers'), where their rows/s alone cannot say."""

    def __init__(self, pids):
        self.pids, self.spent, self.wall, self.began = list(pids), {}, 0.0, None

    def begin(self) -> None:
        self.began = (time.monotonic(), on_cpu_ns_by_thread(self.pids))

    def end(self) -> None:
        (at, before), after = self.began, on_cpu_ns_by_thread(self.pids)
        self.wall += time.monotonic() - at
        for name, ns in after.items():
            self.spent[name] = self.spent.get(name, 0) + ns - before.get(name, 0)

    def cores(self) -> dict[str, float]:
        """Cores by thread name over the spans, busiest first (none under 0.01)."""
        if not self.wall:
            return {}
        cores = {name: round(ns / 1e9 / self.wall, 2) for name, ns in self.spent.items()}
        return {name: c for name, c in sorted(cores.items(), key=lambda kv: -kv[1]) if c >= 0.01}


def budget_view(status: dict) -> dict:
    """What the daemon's status says of the node's budget after the busy rounds: each group's
    tokens and the most threads ever gathering at once, each client's waits, overdrafts, stand-ins and
    what its spares gathered on the decode CPUs."""
    budget = status.get("gather_budget") or {}
    return {"prefill_gathers": budget.get("prefill_gathers"), "decode_spares": budget.get("decode_spares"),
            "groups": [{k: g.get(k) for k in ("tokens", "decode_tokens", "decode_cpus", "peak_gathering", "grants")}
                       for g in budget.get("groups", [])],
            "clients": [{k: (c.get("budget") or {}).get(k) for k in ("wait_s", "yields", "overdraft", "stand_ins", "rows",
                                                                     "spare_blocks", "spare_asides")}
                        for c in status.get("clients", [])]}
