"""Where a decode-size lookup's time goes with the HBM hot-row cache, against the same lookup without it.

    python -m benchmarks.cache.lookup_time [--rows 6144] [--iterations 100] [--table-gib 8] [--endpoint E]
                                           [--hit-share 0.5] [--json FILE]

Starts a daemon on a demo table (or uses --endpoint) and a client whose first layer has a cache
of recency ways only (1% of the layer's rows).  Every call's ids are new: --hit-share of them come
from a hot set of rows looked up before (so they are in the cache, as text's frequent n-grams
are), the rest are fresh uniform ids.  Ids on the GPU, the GPU idle before each call.  For the
same ids with the cache and without it (the table's cache detached for the call):
  eager    host time of ``prefetch()`` + ``wait()`` on the caller's thread and GPU-visible time
           (events around the call on the caller's stream), medians;
  pieces   (cached) the host time of each step of ``HostPath._cached_enqueue``, timed one by one;
  kernels  GPU time per call of each kernel and copy on the device (torch's profiler), and the
           gather pool's rows fetched per call.
"""
from __future__ import annotations

import statistics
import time

import torch

from benchmarks.common import lookup_parser, serving, write_json
from engram_client import EngramClient
from engram_client.lookup.host import host_lookup
from engram_client.tools.bench_timing import timed

CACHE_SHARE = 0.01  # of the layer's rows, recency ways only
HOT_SET = 20000  # rows the hit share is drawn from: fits a 1% cache of any demo table


def draw_ids(table, rows: int, hot: torch.Tensor, hit_share: float) -> torch.Tensor:
    hits = int(rows * hit_share)
    fresh = torch.randint(0, table.num_rows, (rows - hits,), device="cuda")
    chosen = hot[torch.randint(0, hot.numel(), (hits,), device="cuda")]
    ids = torch.cat([chosen, fresh])
    return ids[torch.randperm(rows, device="cuda")]


def eager(table, calls: list[torch.Tensor]) -> dict:
    stream = torch.cuda.current_stream()
    gpu, host = [], []
    for ids in calls:
        g, h = timed(lambda: table.prefetch(ids).wait(), stream)
        gpu.append(g * 1e3)
        host.append(h * 1e3)
    return {"gpu_visible_us": statistics.median(gpu[5:]), "host_us": statistics.median(host[5:])}


def pieces(rows_table, calls: list[torch.Tensor]) -> dict:
    """The cached call's steps, each timed on the caller's thread (HostPath._cached_enqueue's order)."""
    path = rows_table._host
    kernels, raw = path._cache_kernels, path._raw_stream
    names = ("empty", "slot", "fork", "classify", "enqueue", "serve", "finish", "wait")
    times: dict[str, list[float]] = {k: [] for k in names + ("total",)}
    for ids in calls:
        n = ids.numel()
        torch.cuda.synchronize()
        caller = torch.cuda.current_stream().cuda_stream
        t = [time.perf_counter()]
        out = torch.empty((n, path.head_dim), dtype=path.config.out_dtype, device=path.device)
        t.append(time.perf_counter())
        slot = path._free_slot(n, rows_table)
        t.append(time.perf_counter())
        slot.job.fork(caller, raw)
        t.append(time.perf_counter())
        kernels.classify(ids, n, rows_table.row_lo, rows_table.row_hi, slot.slotmap, slot.gather, path.stream, raw)
        t.append(time.perf_counter())
        slot.job.enqueue(raw, raw, rows_table.host_rows.data_ptr(), rows_table.row_lo, rows_table.row_hi,
                         slot.gather.data_ptr(), host_lookup.IDS_ON_DEVICE, True, n, slot.staging.data_ptr(),
                         rows_table.ledger.address, host_lookup.chunk_count(n, path.row_bytes, path.signalled), True)
        t.append(time.perf_counter())
        kernels.serve(slot.staging, out, n, slot.slotmap, slot.gather, path.stream, raw)
        t.append(time.perf_counter())
        slot.job.finish(raw)
        t.append(time.perf_counter())
        path.stream.synchronize()
        t.append(time.perf_counter())
        for key, a, b in zip(names, t, t[1:]):
            times[key].append((b - a) * 1e6)
        times["total"].append((t[-1] - t[0]) * 1e6)
    return {key: statistics.median(v[5:]) for key, v in times.items()}


def kernels(table, calls: list[torch.Tensor], pool) -> dict:
    """GPU microseconds per call of each device activity, and host rows fetched per call."""
    from torch.profiler import ProfilerActivity, profile

    before = pool.cache_counts[2]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for ids in calls:
            table.prefetch(ids).wait()
            torch.cuda.synchronize()
    fetched = (pool.cache_counts[2] - before) / len(calls)
    per_call = {}
    for event in prof.key_averages():
        total = getattr(event, "device_time_total", None)
        if total is None:
            total = event.cuda_time_total
        if total:
            per_call[event.key[:60]] = round(total / len(calls), 2)
    return {"device_us_per_call": dict(sorted(per_call.items(), key=lambda kv: -kv[1])), "host_rows_per_call": fetched}


def main() -> None:
    parser = lookup_parser(__doc__, iterations=100)
    parser.add_argument("--hit-share", type=float, default=0.5)
    args = parser.parse_args()
    results = {"rows": args.rows, "hit_share": args.hit_share}
    with serving(args.endpoint, args.table_gib) as endpoint:
        with EngramClient(endpoint=endpoint, device="cpu", timeout=3600) as probe:
            layer = probe.layers[0]
            num_rows = probe.table(layer).num_rows
        budget = int(num_rows * CACHE_SHARE * (264 + 16))
        with EngramClient(endpoint=endpoint, device="cuda:0", lookup_path="host", timeout=3600,
                          hot_cache_bytes=budget) as client:
            table = client.table(layer)
            rows_table = table._rows
            cache = rows_table._host.cache
            hot = torch.randint(0, table.num_rows, (HOT_SET,), device="cuda")
            for start in range(0, HOT_SET, args.rows):  # into the recency ways
                table.lookup(hot[start:start + args.rows])
            compiled = rows_table._host._cache_kernels
            results["cache"] = {"bytes": budget, "describe": cache.describe(),
                                "compiled_runners": {"classify": {str(k): v.fast for k, v in compiled._classify.items()},
                                                     "serve_side": compiled._serve_fast}}
            print(results["cache"], flush=True)
            pool = client._state.pool
            for name in ("cached", "uncached"):
                rows_table._host.cache = cache if name == "cached" else None
                calls = [draw_ids(table, args.rows, hot, args.hit_share) for _ in range(args.iterations)]
                results[name] = {"eager": eager(table, calls)}
                results[name]["kernels"] = kernels(table, calls[:30], pool)
                if name == "cached":
                    results[name]["pieces"] = pieces(rows_table, calls)
                print(name, results[name], flush=True)
            rows_table._host.cache = cache
    write_json(args.json, results)


if __name__ == "__main__":
    main()
