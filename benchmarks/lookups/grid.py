"""The lookup kernels' grid: how many SMs a prefetch holds, and what that costs the model.

    python -m benchmarks.lookups.grid --table-gib 64

A lookup program that waits on PCIe holds its SM as long as it runs: a dense kernel's
blocks cannot share an SM whose registers it has taken.  So the grid cap trades the
lookup's own speed against the SMs left to the model.  For each (ids per block, warps per
program, programs, priority of the model's stream) it times, on one demo table, with fresh ids every iteration:
  - lookups alone: 6,144 / 49,152 / 393,216 uniform ids (median of --iterations);
  - a bf16 matmul loop alone and with 393,216-id lookups prefetched each step (engramd
    bench's overlap measure: alone and with runs alternated), the time until the lookups
    are done, and the serial time (matmul loop + the same lookups alone) for comparison.
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

import torch

from benchmarks.common import write_json
from engram_client import EngramClient
from engram_client.tools.bench import start_daemon, stop_daemon
from engram_client.tools.bench_ids import SIZES, IdSampler
from engram_client.tools.bench_timing import measure_overlap, time_ms

# (ids per block, warps per program, programs (None: one per block of ids), the model's stream
# priority (0: the default stream's, the lowest; -1: a high-priority stream, so that the
# model's pending blocks get a free SM before the lookup's)).  The client's default first.
CONFIGS = [(16, 4, 33, 0), (16, 4, 16, 0), (16, 4, 4, 0), (16, 4, 1, 0), (64, 8, 8, 0), (16, 4, None, 0),
           (16, 4, 33, -1), (16, 4, 4, -1), (16, 4, None, -1)]


def measure(table, sampler: IdSampler, iterations: int, overlap_steps: int) -> dict:
    stream = torch.cuda.current_stream(sampler.device)
    alone = {}
    for rows in SIZES:
        table.lookup(sampler.sample(rows, "uniform"))  # compiles this size's kernels
        times = []
        for _ in range(iterations):
            ids = sampler.sample(rows, "uniform")
            times.append(time_ms(lambda: table.prefetch(ids).wait(), stream))
        alone[rows] = statistics.median(times)
    overlap = measure_overlap(table, sampler, overlap_steps)
    serial = overlap["alone_ms"]["median_ms"] + overlap_steps * alone[SIZES[-1]]
    return {"lookup_ms": alone, "matmul_alone_ms": overlap["alone_ms"]["median_ms"],
            "matmul_with_ms": overlap["with_prefetch_ms"]["median_ms"], "slowdown": overlap["slowdown"],
            "both_done_ms": overlap["lookups_ms"]["median_ms"], "serial_ms": serial}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table-gib", type=float, default=64.0)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--overlap-steps", type=int, default=10)
    parser.add_argument("--load-threads", type=int, default=16)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    proc, endpoint, _ = start_daemon(args.table_gib, args.load_threads)
    try:
        device = torch.device("cuda", 0)
        with EngramClient(endpoint=endpoint, device=device, timeout=3600) as client:
            base = client.table(client.layers[0])
            sampler = IdSampler(base, device)
            print(f"{torch.cuda.get_device_name(device)}, {torch.cuda.get_device_properties(device).multi_processor_count}"
                  f" SMs; layer {base.layer} of a {client.status()['table_bytes'] / 2**30:.1f} GiB table; lookup ms "
                  f"median of {args.iterations}, fresh uniform ids; matmul loop of {args.overlap_steps} steps")
            print(f"{'rows/blk':>8} {'warps':>5} {'progs':>5} {'prio':>4} {'6144':>7} {'49152':>7} {'393216':>7} "
                  f"{'mm alone':>8} {'mm with':>8} {'slowdown':>8} {'both done':>9} {'serial':>7}")
            results = []
            for block_rows, num_warps, programs, priority in CONFIGS:
                table = replace(base._rows, config=replace(base.config, path="uva", block_rows=block_rows,
                                                           num_warps=num_warps, max_programs=programs))
                head = f"{block_rows:>8} {num_warps:>5} {programs or 'all':>5} {priority:>4}"
                try:
                    with torch.cuda.stream(torch.cuda.Stream(device, priority=priority)):
                        r = measure(table, sampler, args.iterations, args.overlap_steps)
                except Exception as exc:  # a grid the compiler cannot build is a row of the table, not the end
                    print(f"{head} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", flush=True)
                    results.append({"block_rows": block_rows, "num_warps": num_warps, "max_programs": programs,
                                    "priority": priority, "error": repr(exc)[:2000]})
                    continue
                r.update(block_rows=block_rows, num_warps=num_warps, max_programs=programs, priority=priority)
                results.append(r)
                ms = r["lookup_ms"]
                print(f"{head} {ms[6144]:7.3f} {ms[49152]:7.3f} {ms[393216]:7.2f} {r['matmul_alone_ms']:8.2f} "
                      f"{r['matmul_with_ms']:8.2f} {r['slowdown'] * 100:7.1f}% {r['both_done_ms']:9.2f} "
                      f"{r['serial_ms']:7.2f}", flush=True)
    finally:
        stop_daemon(proc)
    write_json(args.json_path, results)


if __name__ == "__main__":
    main()
