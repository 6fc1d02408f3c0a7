"""One lookup at a time, GPU-visible, alone and beside busy neighbours, with the budget's counters.

    python -m benchmarks.lookups.probe --endpoint E [--rows 6144] [--calls 60] [--gap-ms 6.6]
        [--threads default,4,1] [--busy-neighbours 3] [--neighbour-policies normal,idle]
        [--decode-priority normal|fifo] [--json out.json]

For each pool size (``default``: what the node's budget gives a rank), a client on the host path
looks up ``--rows`` fresh uniform ids on the GPU, one call every ``--gap-ms`` (a decode step's
time), eager: an event before prefetch(), one after wait().  Around every call it reads its slot's
budget counters (time its threads waited for tokens, tokens taken, blocks of prefill gathered while
a decode-size job waited), how long its gather threads ran and sat runnable, waiting for a CPU
(schedstat), and how many of them its listings left asleep for want of a token (the pool's wake counts).  With ``--busy-neighbours N`` the same again while N processes loop 393,216-id CPU
gathers on the table (benchmarks/busy_neighbours.py), once per scheduling policy of theirs.  The first 5 calls of each
series are warm-up.  docs/history/benchmarks-2026-12.md, "Engine level with busy neighbours: where the time goes".
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

from benchmarks.busy_neighbours import POLICIES, start_neighbours, stop_neighbours
from benchmarks.common import p90, thread_sched_ns, write_json
from engram_client import EngramClient

WARM = 5


def caller_sched_ns() -> int:
    """ns this thread (the engine's, enqueueing the lookup) sat runnable, waiting for a CPU."""
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
        return int(f.read().split()[1])
COUNTERS = ("wait_s", "acquired", "yields", "small_waits", "rows")


def probe(client, rows: int, calls: int, gap_s: float) -> dict:
    table = client.table(client.layers[0])
    budget, pool = client._state.seat.budget, client._state.seat.pool
    times, deltas = [], []
    for _ in range(WARM + calls):
        ids = torch.randint(0, table.num_rows, (rows,), device=client.device)
        before = budget.stats() if budget is not None else {}
        sched_before, caller_before, wakes_before = thread_sched_ns(), caller_sched_ns(), pool.wake_counts
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        table.prefetch(ids).wait()
        end.record()
        end.synchronize()
        after = budget.stats() if budget is not None else {}
        sched_after, caller_after, wakes_after = thread_sched_ns(), caller_sched_ns(), pool.wake_counts
        times.append(start.elapsed_time(end))
        deltas.append({k: after[k] - before[k] for k in COUNTERS if k in after} |
                      {"workers_ran_ms": (sched_after[0] - sched_before[0]) * 1e-6,
                       "workers_queued_ms": (sched_after[1] - sched_before[1]) * 1e-6,
                       "caller_queued_ms": (caller_after - caller_before) * 1e-6,
                       # workers a listing left asleep (no token for them) and pre-wakes that woke none
                       "workers_left_asleep": wakes_after[1] - wakes_before[1],
                       "prewakes_skipped": wakes_after[2] - wakes_before[2]})
        time.sleep(gap_s)
    times, deltas = times[WARM:], deltas[WARM:]
    result = {"median_ms": statistics.median(times), "p90_ms": p90(times),
              "slowest": sorted(zip(times, deltas), key=lambda pair: -pair[0])[:3],
              "workers_ran_ms_per_call": statistics.median(d["workers_ran_ms"] for d in deltas),
              "workers_queued_ms_per_call": statistics.median(d["workers_queued_ms"] for d in deltas),
              "workers_queued_ms_p90": p90([d["workers_queued_ms"] for d in deltas]),
              "caller_queued_ms_p90": p90([d["caller_queued_ms"] for d in deltas])}
    if budget is not None:
        result.update(wait_ms_per_call=statistics.median(d["wait_s"] * 1e3 for d in deltas),
                      tokens_per_call=statistics.median(d["acquired"] for d in deltas),
                      prefill_blocks_passed_max=budget.stats()["small_wait_blocks_max"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--rows", default="6144", help="ids per call; several, comma-separated")
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--gap-ms", type=float, default=6.6)
    parser.add_argument("--threads", default="default", help="pool sizes: default (the budget's) or numbers")
    parser.add_argument("--busy-neighbours", type=int, default=0)
    parser.add_argument("--neighbour-policies", default="normal",
                        help=f"the neighbours' CPU scheduling policies, one series each: {', '.join(POLICIES)}")
    parser.add_argument("--decode-priority", choices=("normal", "fifo"), default="normal",
                        help="the client's decode_priority (its workers at SCHED_FIFO, or not)")
    parser.add_argument("--json")
    args = parser.parse_args()
    results = {}
    for threads in args.threads.split(","):
        requested = None if threads == "default" else int(threads)
        client = EngramClient(endpoint=args.endpoint, device="cuda:0", lookup_path="host", timeout=900,
                              gather_threads=requested, decode_priority=args.decode_priority)
        try:
            entry = results[f"threads={threads}"] = {"gather_budget": client.gather_budget,
                                                     "decode_priority": client._state.pool.decode_priority}
            for rows in map(int, args.rows.split(",")):
                entry[f"{rows} alone"] = probe(client, rows, args.calls, args.gap_ms * 1e-3)
                for policy in args.neighbour_policies.split(",") if args.busy_neighbours else ():
                    busy = f"{rows} busy" + ("" if policy == "normal" else f" ({policy} neighbours)")
                    neighbours = start_neighbours(args.endpoint, args.busy_neighbours, policy)
                    try:
                        entry[busy] = probe(client, rows, args.calls, args.gap_ms * 1e-3)
                    finally:
                        entry[busy + " reports"] = stop_neighbours(neighbours)
                for case in [c for c in entry if c.startswith(f"{rows} ") and not c.endswith(" reports")]:
                    e = entry[case]
                    print(f"threads={threads} {case}: median {e['median_ms']:.3f} ms, p90 {e['p90_ms']:.3f} ms, "
                          f"waited {e.get('wait_ms_per_call', 0):.3f} ms for {e.get('tokens_per_call', 0)} tokens, "
                          f"workers ran {e['workers_ran_ms_per_call']:.3f} ms and queued for a CPU "
                          f"{e['workers_queued_ms_per_call']:.3f} ms", flush=True)
        finally:
            client.close()
    write_json(args.json, results)


if __name__ == "__main__":
    main()
