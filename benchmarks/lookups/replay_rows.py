"""A captured lookup's GPU-visible time by rows a call, beside a plain copy of the same bytes.

    python -m benchmarks.lookups.replay_rows [--endpoint E] [--sizes 6144,4608,3352,2048,1024] [--iterations 100] [--json FILE]

For each size: one prefetch and its consumer captured in a CUDA graph, replayed with fresh uniform
ids copied in first (``benchmarks/lookups/host_time.py``'s ``replay``: events around the replay, back to
back and 5 ms apart), and a copy of rows x 264 bytes from pinned memory to HBM (the ceiling the
copy engine sets).  What it answers: how much of a decode-size call's time its row count sets
(the HBM cache fetches fewer rows a call, docs/BENCHMARKS.md).  Medians.
"""
from __future__ import annotations

import statistics

import torch

from benchmarks.common import lookup_parser, serving, write_json
from benchmarks.lookups.host_time import replay
from engram_client import EngramClient
from engram_client.tools.bench_timing import timed

ROW_BYTES = 264


def copy_us(rows: int, iterations: int) -> float:
    src = torch.empty(rows * ROW_BYTES, dtype=torch.uint8).pin_memory()
    dst = torch.empty(rows * ROW_BYTES, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream()
    samples = [timed(lambda: dst.copy_(src, non_blocking=True), stream)[0] * 1e3 for _ in range(iterations)]
    return statistics.median(samples[5:])


def main() -> None:
    parser = lookup_parser(__doc__, iterations=100)
    parser.add_argument("--sizes", default="6144,4608,3352,2048,1024")
    args = parser.parse_args()
    results = {}
    with serving(args.endpoint, args.table_gib) as endpoint:
        with EngramClient(endpoint=endpoint, device="cuda:0", timeout=600) as client:
            table = client.table(client.layers[0])
            for rows in (int(size) for size in args.sizes.split(",")):
                results[rows] = {**replay(table, rows, args.iterations), "copy_us": copy_us(rows, args.iterations // 2)}
                print(rows, results[rows], flush=True)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
