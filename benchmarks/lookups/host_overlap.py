"""Where the host path's cost beside a model goes: dequant grids, pool sizes, torch's OpenMP pool.

    python -m benchmarks.lookups.host_overlap [--table-gib 16] [--grids all/16,32/32] [--threads 15,8] [--json out.json]

Starts a daemon on a demo table (or uses --endpoint).  For each gather pool size and each
staged-dequant grid (``programs/block_rows``; ``all``: one program per block of rows;
``none``: no dequant at all, rows only gathered and copied, to show the floor), it checks
one lookup against the naive baseline (except ``none``), times lookups of 6,144 and 393,216
uniform ids (GPU-visible and caller's-thread ms, fresh ids each) and measures the slowdown of
the bench's bf16 matmul loop beside prefetched 393,216-id lookups (bench_timing.py).

First, with the first pool size, it times 393,216-id lookups right after a torch CPU op of
the same size (one that runs on torch's OpenMP pool) against lookups with nothing before them,
and text ids (as hashed, as int64, shuffled): a parallel torch op leaves its
OpenMP threads spinning for milliseconds on the cores the gather pool needs.
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

import numpy as np
import torch

from benchmarks.common import serving, timed as timed_host, write_json
from engram_client import EngramClient
from engram_client.lookup.host import _host_gather
from engram_client.lookup.host.dequant_kernel import StagedDequant
from engram_client.tools.bench import naive_lookup
from engram_client.tools.bench_ids import IdSampler
from engram_client.tools.bench_timing import measure_overlap, timed

PREFILL, DECODE = 393216, 6144


class _NoDequant:
    """Leaves the staged rows where they are: the gather and the copies alone."""

    def __call__(self, staging, out, n, stream, raw_stream) -> None:
        pass


def _grid(spec: str):
    if spec == "none":
        return None
    programs, block_rows = spec.split("/")
    return (None if programs == "all" else int(programs)), int(block_rows)


def _median_times(call, sample, rows: int, iterations: int, stream) -> dict:
    gpu, host = [], []
    for _ in range(iterations):
        ids = sample(rows)
        g, h = timed(lambda: call(ids), stream)
        gpu.append(g)
        host.append(h)
    return {"gpu_ms": statistics.median(gpu), "host_ms": statistics.median(host), "max_gpu_ms": max(gpu)}


def measure_grids(table, host, sampler, grids: list[str], iterations: int, steps: int) -> list[dict]:
    stream = torch.cuda.current_stream(table.device)
    rows_view = table.rows_view.view(-1, table.layout.row_bytes)
    weight_view, scale_view = rows_view[:, :table.head_dim], rows_view[:, table.head_dim:]
    results = []
    for spec in grids:
        grid = _grid(spec)
        host._host._dequant = _NoDequant() if grid is None else StagedDequant(
            table.head_dim, table.layout.row_bytes, table.config.out_dtype, table.device, *grid)
        exact = None
        if grid is not None:
            ids = sampler.sample(PREFILL, "uniform")
            exact = bool(torch.equal(host.prefetch(ids).wait().view(torch.int16),
                                     naive_lookup(weight_view, scale_view, ids).view(torch.int16)))
        row = {"grid": spec, "exact": exact}
        for rows in (DECODE, PREFILL):
            row[str(rows)] = _median_times(lambda ids: host.prefetch(ids).wait(),
                                           lambda n: sampler.sample(n, "uniform"), rows, iterations, stream)
        overlap = measure_overlap(host, sampler, steps)
        row["slowdown"] = overlap["slowdown"]
        row["alone_ms"], row["with_ms"] = overlap["alone_ms"]["median_ms"], overlap["with_prefetch_ms"]["median_ms"]
        row["lookups_ms"] = overlap["lookups_ms"]["median_ms"]
        results.append(row)
        print(f"  grid {spec:>8}: exact {exact}, {DECODE} ids {row[str(DECODE)]['gpu_ms']:.3f} ms "
              f"(host {row[str(DECODE)]['host_ms']:.3f}), {PREFILL} ids {row[str(PREFILL)]['gpu_ms']:.3f} ms "
              f"(max {row[str(PREFILL)]['max_gpu_ms']:.3f}); matmul loop {row['alone_ms']:.2f} -> {row['with_ms']:.2f} "
              f"ms: {row['slowdown'] * 100:+.1f}%, lookups done at {row['lookups_ms']:.1f} ms", flush=True)
    return results


def _gather_ms(table, ids: torch.Tensor, out: torch.Tensor) -> float:
    """One gather on the host (the pool's threads, GIL released), nothing on the GPU."""
    ids = ids.cpu().contiguous()
    return timed_host(lambda: table.pool.gather(table.host_rows.data_ptr(), table.row_lo, table.row_hi,
                                                table.layout.row_bytes, ids.data_ptr(), ids.dtype == torch.int64,
                                                ids.numel(), out.data_ptr(), 0)) * 1e3


def measure_gather_tuning(table, sampler, settings: list[str], iterations: int) -> dict:
    """Host gather time of 393,216 uniform ids for each setting near/far/hint/streaming (set_tuning)."""
    default = _host_gather.get_tuning()
    out = torch.ones(PREFILL * table.layout.row_bytes, dtype=torch.uint8)  # touched once, up front
    results = {}
    for spec in settings:
        _host_gather.set_tuning(*(int(v) for v in spec.split("/")))
        times = [_gather_ms(table, sampler.sample(PREFILL, "uniform"), out) for _ in range(iterations + 1)][1:]
        results[spec] = {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times)}
        print(f"  gather {spec:>11}: gather {results[spec]['median_ms']:.3f} ms "
              f"(min {results[spec]['min_ms']:.3f}, max {results[spec]['max_ms']:.3f})", flush=True)
    _host_gather.set_tuning(*default)
    return results


def measure_ids(table, host, sampler, client, layer: int, iterations: int) -> dict:
    """Lookups and host gathers of 393,216 ids by where they come from: uniform (int64, int32),
    uniform right after a parallel torch CPU op, text ids (int32 as hashed, int64, shuffled)."""
    stream = torch.cuda.current_stream(host.device)
    out = torch.ones(PREFILL * table.layout.row_bytes, dtype=torch.uint8)
    spare = torch.zeros(PREFILL // 24, 2, 24, dtype=torch.int32)
    call = lambda ids: host.prefetch(ids).wait()  # noqa: E731

    def after_torch_op(rows: int) -> torch.Tensor:
        ids = sampler.sample(rows, "uniform")
        torch.cuda.synchronize()
        spare[:, 1].reshape(-1)  # a strided copy over the grain size: torch's OpenMP pool runs it
        return ids

    sources = {"uniform": lambda n: sampler.sample(n, "uniform"),
               "uniform_int32": lambda n: sampler.sample(n, "uniform").to(torch.int32),
               "uniform_after_torch_op": after_torch_op}
    from engram_client.tools.bench_text import TextWorkload, v4_tokenizer_path
    if v4_tokenizer_path() is not None:
        layouts = [client.table(layer_id).layout for layer_id in client.layers]
        workload = TextWorkload(layouts, layer, client.hasher.max_ngram if client.hasher.available else 4)
        sources["text"] = lambda n: workload.sample(n).to(host.device)
        # numpy, not torch, reorders and widens: a torch op of this size would wake torch's OpenMP pool
        sources["text_int64"] = lambda n: torch.from_numpy(workload.sample(n).numpy().astype(np.int64)).to(host.device)
        sources["text_shuffled"] = lambda n: torch.from_numpy(np.random.permutation(workload.sample(n).numpy())).to(
            host.device)
    result = {"torch_threads": torch.get_num_threads()}
    for name, source in sources.items():
        lookup = _median_times(call, source, PREFILL, iterations, stream)
        gathers = [_gather_ms(table, source(PREFILL), out) for _ in range(iterations)]
        result[name] = dict(lookup, gather_ms=statistics.median(gathers), gather_max_ms=max(gathers))
        print(f"  {name:>24}: lookup {lookup['gpu_ms']:.3f} ms (max {lookup['max_gpu_ms']:.3f}), host gather "
              f"{result[name]['gather_ms']:.3f} ms (max {result[name]['gather_max_ms']:.3f})", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description="The host path beside a matmul loop, by dequant grid and pool size.")
    parser.add_argument("--endpoint", default=None)
    parser.add_argument("--table-gib", type=float, default=16.0)
    parser.add_argument("--grids", default="none,all/16,132/16,32/32,16/64,8/64")
    parser.add_argument("--rest-grids", default="none,all/16,32/32,16/64", help="grids for the other pool sizes")
    parser.add_argument("--tuning", default="16/0/3/0,16/0/3/1,16/0/0/0,16/0/0/1,8/0/3/0,16/48/3/0,16/48/3/1",
                        help="gather settings near/far/hint/streaming to time the host gather with")
    parser.add_argument("--threads", default="15,8")
    parser.add_argument("--iterations", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="matmul-loop steps (engramd bench: 10)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = {"table_gib": args.table_gib, "runs": []}
    with serving(args.endpoint, args.table_gib, load_threads=8) as endpoint:
        for index, threads in enumerate(int(t) for t in args.threads.split(",")):
            client = EngramClient(endpoint=endpoint, device=torch.device("cuda", 0), timeout=600,
                                  gather_threads=threads)
            layer = client.layers[0]
            table = client.table(layer)
            host = replace(table._rows, config=replace(table.config, path="host"))  # the client's rows, other options
            sampler = IdSampler(table, table.device)
            print(f"{threads} gather threads, layer {layer}:", flush=True)
            run = {"threads": threads}
            if index == 0:  # with the default dequant, before the grids replace it
                run["ids"] = measure_ids(table, host, sampler, client, layer, args.iterations)
                run["tuning"] = measure_gather_tuning(table, sampler, args.tuning.split(","), args.iterations)
            grids = (args.grids if index == 0 else args.rest_grids).split(",")
            run["grids"] = measure_grids(table, host, sampler, grids, args.iterations, args.steps)
            results["runs"].append(run)
            client.close()
            write_json(args.json, results)


if __name__ == "__main__":
    main()
