"""A decode-size lookup's host stage beside ranks that prefill, on the CPU alone: where its time goes.

    python -m benchmarks.node.decode_beside_prefill [--mode eager|graph] [--tokens 2] [--neighbours 2]
        [--table-gib 2] [--policies normal,batch,idle,crew,decode,decode-quiet,decode-fifo] [--decode-cpus 1]
        [--calls 150] [--hogs 1]
        [--json out.json]

No daemon and no GPU: the parts of the node budget a decode-size call depends on, real.  A budget
memfd of --tokens tokens (budget_file.create, as the daemon makes it) on CPUs 0..tokens-1, a table
file of --table-gib random bytes on /dev/shm, and:
  decode      this process's pool of --tokens workers on the budget, a signalled slot of 6,144 rows
              (SignalTestSlot: the stream's part played here, as tests/unit/test_stream_signal.py
              does), one call every 6.6 ms (a decode step), fresh uniform ids, timed from the arming
              of the word to its last chunk.  --mode eager: each call prepared as an enqueue does,
              the word armed 30 us later (the ids' copy); graph: one slot prepared once, its ids
              rewritten in place before each arming, as a replay of a captured graph.
  neighbours  --neighbours processes with pools of --tokens threads (the caller gathering too) on
              the same budget, looping 393,216-row gathers: ranks that prefill.
--policies: the neighbours' CPU scheduling policy, one series each: ``normal`` (SCHED_OTHER, what
ranks run at), ``batch`` (SCHED_BATCH) and ``idle`` (SCHED_IDLE: a prefill's threads give their CPU
up the moment another thread wakes on it), and ``crew``: the product's own way to the same end,
the neighbours at normal priority on a budget that asks for a prefill crew (engramd
--prefill-gathers idle: each pool gathers prefill-size jobs on threads of its own at SCHED_IDLE,
engram_client/lookup/host/engine/crew.c; the decode pool has one too, unused), and ``decode``: the neighbours at normal priority
on a budget that keeps --decode-cpus of its tokens and CPUs (the last ones) for decode-size calls
(engramd --decode-cpus: each pool's prefill crew at normal priority off those CPUs, its spares at
SCHED_IDLE on them, gathering beside decode calls too: --decode-spares idle); ``decode-quiet``: the
same with the spares standing aside while a rank decodes (--decode-spares quiet, the daemon's
default), the decode pool's workers at normal priority; ``decode-fifo``: the same with them at
SCHED_FIFO 1 (the client's decode_priority "fifo"; this process must be allowed it), whose decode
calls the spares do not stand aside for.  For each: the decode call alone and beside the
neighbours (median, p90, its first chunk, how long its workers sat runnable waiting for a CPU,
from schedstat), and the neighbours' rows/s with no decode call and with --hogs CPU-bound
processes of normal priority on the same CPUs (what the policy costs a prefill where other
threads crowd the gather CPUs).  docs/history/benchmarks-2026-12.md, "Decode beside prefill, the host stage on the
CPU".
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks.busy_neighbours import POLICIES, SET_POLICY
from benchmarks.common import p90, thread_sched_ns, write_json
from engram_client.core import budget_file
from engram_client.lookup.host import _host_gather
from engram_client.lookup.host.host_lookup import IDS_IN_PLACE, IDS_ON_HOST

ROW_BYTES, DECODE_ROWS, PREFILL_ROWS, ARMED = 264, 6144, 393216, 0
WARM = 10

NEIGHBOUR = SET_POLICY + r"""
import mmap, select, sys, time
import numpy as np
from engram_client.core import budget_file
from engram_client.lookup.host.host_lookup import _host_gather
fd, path, tokens, policy, seed = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
row_bytes, call_rows = int(sys.argv[6]), int(sys.argv[7])
set_policy(policy)
budget = _host_gather.NodeBudget(fd, 0, tokens, budget_file.MAX_SLOTS)
pool = _host_gather.GatherPool(tokens, caller_gathers=True, budget=budget, cpus=list(range(tokens)))
with open(path, "rb") as f:
    table = np.frombuffer(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ), dtype=np.uint8)
rows = table.size // row_bytes
ids = np.random.default_rng(seed).integers(0, rows, call_rows)
out, counter = np.empty((ids.size, row_bytes), np.uint8), np.zeros(1, np.int64)
print("ready", flush=True)
calls, began = 0, time.monotonic()
while not select.select([sys.stdin], [], [], 0)[0]:
    pool.gather(table.ctypes.data, 0, rows, row_bytes, ids.ctypes.data, True, ids.size, out.ctypes.data,
                counter.ctypes.data)
    calls += 1
print(calls * ids.size / (time.monotonic() - began), flush=True)
"""
HOG = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end: pass\n"


@contextlib.contextmanager
def neighbours(fd: int, path: str, tokens: int, count: int, policy: str):
    """The prefilling neighbours, started and ready; yields a list that gets their rows/s each."""
    procs = [subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(fd), path, str(tokens), policy, str(i),
                               str(ROW_BYTES), str(PREFILL_ROWS)],
                              pass_fds=(fd,), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for i in range(count)]
    rates: list[float] = []
    try:
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit(f"a prefilling neighbour (pid {proc.pid}) did not start")
        time.sleep(0.2)
        yield rates
    finally:
        for proc in procs:
            out, _ = proc.communicate("", timeout=120)
            if proc.returncode != 0 or not out.split():
                raise SystemExit(f"a prefilling neighbour (pid {proc.pid}) ended with rc {proc.returncode} and no rate")
            rates.append(float(out.split()[-1]))


def decode_calls(pool, table: np.ndarray, calls: int, graph: bool) -> dict:
    """Signalled 6,144-row calls one decode step apart: ms from arming to the first and the last chunk.
    Eager: each call prepared as an enqueue does (pre-waking the pool); graph: one slot prepared once,
    its ids rewritten in place and the word armed by the "stream" alone, as a replay does."""
    slot = _host_gather.SignalTestSlot(pool, DECODE_ROWS, ROW_BYTES, graph=graph)
    word = np.ctypeslib.as_array((ctypes.c_uint32 * 1).from_address(slot.word_address))
    counter, rows = np.zeros(1, np.int64), table.size // ROW_BYTES
    rng = np.random.default_rng(1)
    ids = np.zeros(DECODE_ROWS, dtype=np.int64)
    if graph:
        slot.prepare(table.ctypes.data, 0, rows, ids.ctypes.data, IDS_IN_PLACE, True, DECODE_ROWS, counter.ctypes.data, 4)
    total, first, queued = [], [], []

    def reached(value: int) -> bool:  # GEQ, cyclic, as the driver compares
        return (int(word[0]) - value) & 0xFFFFFFFF < 0x80000000

    for _ in range(WARM + calls):
        ids[:] = rng.integers(0, rows, DECODE_ROWS)
        sched_before = thread_sched_ns()
        if not graph:
            slot.prepare(table.ctypes.data, 0, rows, ids.ctypes.data, IDS_ON_HOST, True, DECODE_ROWS,
                         counter.ctypes.data, 4)
            time.sleep(30e-6)  # the ids' copy to the GPU, then the stream arms the word
        armed = time.perf_counter()
        word[0] = ARMED
        deadline = armed + 10.0
        for chunk, times in ((1, first), (slot.nchunks, total)):
            while not reached(chunk):
                if time.perf_counter() > deadline:
                    raise SystemExit(f"chunk {chunk} of a decode call not staged within 10 s")
                time.sleep(10e-6)
            times.append((time.perf_counter() - armed) * 1e3)
        while slot.in_flight or slot.active:  # the run's end, before the next call reuses the slot
            if time.perf_counter() > deadline:
                raise SystemExit("a decode call's run did not end within 10 s of its arming")
            time.sleep(20e-6)
        queued.append((thread_sched_ns()[1] - sched_before[1]) * 1e-6)
        time.sleep(0.0066)
    total, first, queued = total[WARM:], first[WARM:], queued[WARM:]
    return {"median_ms": statistics.median(total), "p90_ms": p90(total), "first_chunk_ms": statistics.median(first),
            "workers_queued_ms": statistics.median(queued)}


def prefill_rates(fd: int, path: str, tokens: int, count: int, policy: str, hogs: int, seconds: float) -> float:
    """The neighbours' rows/s in all, alone on the budget, beside ``hogs`` CPU-bound processes."""
    with neighbours(fd, path, tokens, count, policy) as rates:
        hogging = [subprocess.Popen([sys.executable, "-c", HOG, str(seconds)]) for _ in range(hogs)]
        time.sleep(seconds)
        for hog in hogging:
            hog.wait(timeout=30)
    return sum(rates)


# The neighbours' policies, the budget's prefill crew, its decode CPUs (spares gathering beside decode
# calls too: --decode-spares idle), the daemon's default rules (--decode-spares quiet) with the decode
# pool's workers at normal priority, and the same with them at SCHED_FIFO 1 (the client's
# decode_priority "fifo").
SERIES = POLICIES + ("crew", "decode", "decode-quiet", "decode-fifo")
QUIET = ("decode-quiet", "decode-fifo")


def series(name: str, path: str, table: np.ndarray, args) -> dict:
    crew = name == "crew"
    policy = "normal" if name in ("crew", "decode") + QUIET else name
    flags = budget_file.FLAG_PREFILL_IDLE if crew else budget_file.FLAG_SPARES_QUIET if name in QUIET else 0
    fd = budget_file.create([args.tokens], flags=flags,
                            decode=[args.decode_cpus if name.startswith("decode") else 0])
    try:
        budget = _host_gather.NodeBudget(fd, 0, args.tokens, budget_file.MAX_SLOTS)
        pool = _host_gather.GatherPool(args.tokens, caller_gathers=False, budget=budget, cpus=list(range(args.tokens)),
                                       decode_priority=1 if name == "decode-fifo" else 0)
        if name == "decode-fifo" and not pool.decode_priority[0]:
            raise SystemExit(f"decode-fifo: this process may not run threads at SCHED_FIFO "
                             f"({os.strerror(pool.decode_priority[1])})")
        try:
            graph = args.mode == "graph"
            result = {"alone": decode_calls(pool, table, args.calls, graph)}
            with neighbours(fd, path, args.tokens, args.neighbours, policy) as rates:
                result["busy"] = decode_calls(pool, table, args.calls, graph)
            result["busy"]["neighbours_m_rows_s"] = sum(rates) / 1e6
        finally:
            pool.close()
        for hogs in sorted({0, args.hogs}):
            result[f"prefill_m_rows_s_{hogs}_hogs"] = prefill_rates(fd, path, args.tokens, args.neighbours, policy,
                                                                    hogs, args.seconds) / 1e6
        return result
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2)
    parser.add_argument("--neighbours", type=int, default=2)
    parser.add_argument("--table-gib", type=float, default=2.0)
    parser.add_argument("--policies", default="normal,batch,idle,crew",
                        help="the neighbours' CPU scheduling policies, and crew (module docstring)")
    parser.add_argument("--decode-cpus", type=int, default=1, help="the decode series' decode tokens and CPUs")
    parser.add_argument("--calls", type=int, default=150)
    parser.add_argument("--mode", choices=("eager", "graph"), default="eager",
                        help="a call prepared each time (eager), or one slot replayed (graph)")
    parser.add_argument("--hogs", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0, help="how long each prefill-rate case runs")
    parser.add_argument("--json")
    args = parser.parse_args()
    unknown = set(args.policies.split(",")) - set(SERIES)
    if unknown:
        raise SystemExit(f"--policies: {', '.join(sorted(unknown))} not among {', '.join(SERIES)}")
    if args.tokens > len(os.sched_getaffinity(0)) or not set(range(args.tokens)) <= os.sched_getaffinity(0):
        raise SystemExit(f"--tokens {args.tokens}: CPUs 0..{args.tokens - 1} must all be open to this process")
    fd, path = tempfile.mkstemp(prefix="decode-beside-prefill-", dir="/dev/shm")
    try:
        block = np.random.default_rng(0).integers(0, 256, 64 << 20, dtype=np.uint8).tobytes()
        for _ in range(max(1, int(args.table_gib * 16))):
            os.write(fd, block)
        table = np.frombuffer(mmap.mmap(fd, 0, prot=mmap.PROT_READ), dtype=np.uint8)
        results = {"tokens": args.tokens, "neighbours": args.neighbours, "cpus": os.cpu_count(), "mode": args.mode,
                   "policies": {}}
        print("| neighbours | decode alone: median / p90 ms | beside prefill: median / p90 ms | first chunk ms | "
              f"workers queued ms | neighbours beside the calls, M rows/s | prefill M rows/s | with {args.hogs} hog(s) |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
        for name in args.policies.split(","):
            r = results["policies"].setdefault(name, [])
            r.append(series(name, path, table, args))
            r = r[-1]
            a, b = r["alone"], r["busy"]
            print(f"| {name} | {a['median_ms']:.2f} / {a['p90_ms']:.2f} | {b['median_ms']:.2f} / {b['p90_ms']:.2f} | "
                  f"{a['first_chunk_ms']:.2f} / {b['first_chunk_ms']:.2f} | {a['workers_queued_ms']:.2f} / "
                  f"{b['workers_queued_ms']:.2f} | {b['neighbours_m_rows_s']:.1f} | {r['prefill_m_rows_s_0_hogs']:.1f} | "
                  f"{r[f'prefill_m_rows_s_{args.hogs}_hogs']:.1f} |", flush=True)
    finally:
        os.close(fd)
        os.unlink(path)  # the file this run made
    write_json(args.json, results)


if __name__ == "__main__":
    main()
