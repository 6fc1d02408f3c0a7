"""One lookup at a time, GPU-visible, alone and beside busy neighbours, with the budget's counters.

    python -m benchmarks.lookup_probe --endpoint E [--rows 6144] [--calls 60] [--gap-ms 6.6]
        [--threads default,4,1] [--busy-neighbours 3] [--json out.json]

For each pool size (``default``: what the node's budget gives a rank), a client on the host path
looks up ``--rows`` fresh uniform ids on the GPU, one call every ``--gap-ms`` (a decode step's
time), eager: an event before prefetch(), one after wait().  Around every call it reads its slot's
budget counters (time its threads waited for tokens, tokens taken, blocks of prefill gathered while
a decode-size job waited).  With ``--busy-neighbours N`` the same again while N processes loop
393,216-id CPU gathers on the table (benchmarks/busy_neighbours.py).  The first 5 calls of each
series are warm-up.  docs/BENCHMARKS.md, "Engine level with busy neighbours: where the time goes".
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.busy_neighbours import start_neighbours, stop_neighbours
from benchmarks.common import p90, write_json
from engram_client import EngramClient

WARM = 5
COUNTERS = ("wait_s", "acquired", "yields", "small_waits", "rows")


def probe(client, rows: int, calls: int, gap_s: float) -> dict:
    table = client.table(client.layers[0])
    budget = client._state.seat.budget
    times, deltas = [], []
    for _ in range(WARM + calls):
        ids = torch.randint(0, table.num_rows, (rows,), device=client.device)
        before = budget.stats() if budget is not None else {}
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        table.prefetch(ids).wait()
        end.record()
        end.synchronize()
        after = budget.stats() if budget is not None else {}
        times.append(start.elapsed_time(end))
        deltas.append({k: after[k] - before[k] for k in COUNTERS if k in after})
        time.sleep(gap_s)
    times, deltas = times[WARM:], deltas[WARM:]
    result = {"median_ms": statistics.median(times), "p90_ms": p90(times),
              "slowest": sorted(zip(times, deltas), key=lambda pair: -pair[0])[:3]}
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
    parser.add_argument("--json")
    args = parser.parse_args()
    results = {}
    for threads in args.threads.split(","):
        requested = None if threads == "default" else int(threads)
        client = EngramClient(endpoint=args.endpoint, device="cuda:0", lookup_path="host", timeout=900,
                              gather_threads=requested)
        try:
            entry = results[f"threads={threads}"] = {"gather_budget": client.gather_budget}
            for rows in map(int, args.rows.split(",")):
                entry[f"{rows} alone"] = probe(client, rows, args.calls, args.gap_ms * 1e-3)
                if args.busy_neighbours:
                    neighbours = start_neighbours(args.endpoint, args.busy_neighbours)
                    try:
                        entry[f"{rows} busy"] = probe(client, rows, args.calls, args.gap_ms * 1e-3)
                    finally:
                        entry[f"{rows} neighbours"] = stop_neighbours(neighbours)
                for case in (f"{rows} alone", f"{rows} busy"):
                    if case in entry:
                        e = entry[case]
                        print(f"threads={threads} {case}: median {e['median_ms']:.3f} ms, p90 {e['p90_ms']:.3f} ms, "
                              f"waited {e.get('wait_ms_per_call', 0):.3f} ms for {e.get('tokens_per_call', 0)} tokens",
                              flush=True)
        finally:
            client.close()
    write_json(args.json, results)


if __name__ == "__main__":
    main()
