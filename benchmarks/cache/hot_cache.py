"""The HBM hot-row cache on text: rows fetched from host memory and lookup time, with and without it.

    python -m benchmarks.cache.hot_cache [--table-gib 32] [--cache-percent 1] [--steps 60] [--text-mib 0] [--json FILE]

Starts a daemon on a demo table, tokenizes the bench's text (engram_client/tools/bench_text.py:
CPython's topic docs and this project's docs, DeepSeek-V4's tokenizer and hash) and splits it: the
first 70% of its tokens train the frequency list (each layer's rows counted over prefill windows,
as ``engramd hot-rows build`` counts), the last 30% are the held-out workload.  For each mode
(no cache; recency part only; the list's fixed part + recency) and each call size (a decode step of
256 sequences, 6,144 ids; a 16,384-token prefill, 393,216 ids), it looks up held-out ids with ids
on the GPU, each call's ids new (decode sequences advance a token a step; prefill windows follow
each other): first ``--warm`` calls (one for prefill; the recency part learns), then the timed ones, each
synchronized (median of the GPU-visible time), and the rows the host gathered (the gather pool's
own counts).  Decode is measured twice, each time on a cache of its own that learns from the same
calls: eagerly (``decode``: the caller's time to the rows, every launch included) and as an engine
runs it (``decode_graph``: one captured prefetch and its consumer, replayed with each step's ids
copied in first; events around the replay, so launches cost nothing, as under an engine's CUDA
graphs).  The fixed part is installed from the list in-process (HbmRowCache with the ranked ids),
the same rows a served list would give.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from benchmarks.common import serving, write_json

SPLIT = 0.7


def layer_counts(workload, tokens: torch.Tensor, window: int = 16384) -> np.ndarray:
    """Row ids of one layer over prefill windows of ``tokens``, ranked most frequent first."""
    seen = []
    for start in range(0, tokens.numel(), window):
        rows = workload.hasher.row_ids(tokens[start:start + window])
        seen.append(np.ascontiguousarray(rows.numpy()[:, workload.layer_index]).reshape(-1))
    ids, counts = np.unique(np.concatenate(seen), return_counts=True)
    return ids[np.argsort(-counts, kind="stable")]


def layer_budget(rows_in_layer: int, percent: float, row_bytes: int = 264) -> int:
    """A layer's cache bytes for ``percent`` of its rows in all (half fixed, half recency with a
    list), with their keys and stamps."""
    return int(rows_in_layer * percent / 100 * (row_bytes + 16))


def install(client, layer: int, budget: int, ranked) -> None:
    from engram_client.lookup.cache.layer_caches import cache_for_layer

    rows = client.table(layer)._rows
    cache = cache_for_layer(budget, rows.layout, rows.host_rows, rows.row_lo, rows.row_hi, client.device,
                            client._state.pool, client._state.stream, ranked)
    if rows._host.cache is not None:
        rows._host.cache.disarm(client._state.stream)
    rows.hbm_cache = rows._host.cache = cache


def measure(pool, calls, warm: int, steps: int, run, timed_run) -> dict:
    """``run`` the first ``warm`` calls (the recency part learns), then ``timed_run`` (seconds) the
    next ``steps``, counting the rows the host gathered for those."""
    for ids in calls[:warm]:
        run(ids)
    torch.cuda.synchronize()
    before = pool.cache_counts[2]
    times = [timed_run(ids) for ids in calls[warm:warm + steps]]
    fetched = (pool.cache_counts[2] - before) / len(times)
    return {"median_ms": statistics.median(times) * 1e3, "fetched_per_call": fetched, "ids": calls[0].numel()}


def run_mode(client, table, calls, warm: int, steps: int) -> dict:
    """Eager lookups, each synchronized: the caller's time to the rows, every launch included."""
    def timed_lookup(ids) -> float:
        torch.cuda.synchronize()
        started = time.perf_counter()
        table.lookup(ids)
        torch.cuda.synchronize()
        return time.perf_counter() - started
    return measure(client._state.pool, calls, warm, steps, table.lookup, timed_lookup)


def run_graph(client, table, calls, warm: int, steps: int) -> dict:
    """Decode under a CUDA graph: each step's ids copied into the captured buffer, then the replay
    timed by events on the replaying stream (GPU-visible, launches inside the graph)."""
    from engram_client.tools.bench_timing import timed

    stream = torch.cuda.current_stream()
    static = calls[0].clone()
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(stream)
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        table.prefetch(static).wait() * 1
    torch.cuda.synchronize()

    def replay(ids) -> None:
        static.copy_(ids)
        graph.replay()

    def timed_replay(ids) -> float:
        static.copy_(ids)
        return timed(graph.replay, stream)[0] / 1e3
    return measure(client._state.pool, calls, warm, steps, replay, timed_replay)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table-gib", type=float, default=32.0)
    parser.add_argument("--cache-percent", type=float, default=1.0, help="of each layer's rows")
    parser.add_argument("--warm", type=int, default=100)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--layer", type=int, default=None)
    parser.add_argument("--text-mib", type=float, default=0.0,
                        help="the Python standard library's sources (code_text) instead of the bench's text")
    parser.add_argument("--endpoint", default=None, help="an engramd already serving [default: start one]")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from engram_client import EngramClient
    from engram_client.tools.bench_text import DECODE_SEQUENCES, TextWorkload, code_text

    results = {"table_gib": args.table_gib, "cache_percent": args.cache_percent, "modes": {}}
    with serving(args.endpoint, args.table_gib, load_threads=16) as endpoint:
        with EngramClient(endpoint=endpoint, device="cuda:0", timeout=600) as probe:
            layouts = [probe.table(layer).layout for layer in probe.layers]
            layer = args.layer if args.layer is not None else probe.layers[0]
            rows_in_layer = probe.table(layer).num_rows
        workload = TextWorkload(layouts, layer, 4, text=code_text(int(args.text_mib * 2**20)) if args.text_mib else None)
        total = workload.tokens.numel()
        train = workload.tokens[:int(total * SPLIT)]
        started = time.perf_counter()
        ranked = layer_counts(workload, train)
        results["list_seconds"] = time.perf_counter() - started
        results["tokens"] = {"train": train.numel(), "held_out": total - train.numel()}
        results["text"] = workload.text  # runs compare only on the same text (bench_text.text_identity)
        # Held-out calls: prefill windows and decode sequences start in the last 30%.
        held_from = int(total * SPLIT)
        workload._prefill_at = held_from
        workload._decode_at = held_from + torch.arange(DECODE_SEQUENCES) * ((total - held_from) // DECODE_SEQUENCES) + 4
        need = args.warm + args.steps
        if need > (total - held_from) // DECODE_SEQUENCES:  # else sequences re-read each other's text
            raise SystemExit(f"--warm {args.warm} + --steps {args.steps}: the held-out text gives each of the "
                             f"{DECODE_SEQUENCES} sequences {(total - held_from) // DECODE_SEQUENCES} tokens; give "
                             "more --text-mib or fewer steps")
        decode = [workload.decode().cuda() for _ in range(need)]
        # The held-out text has only a few 16,384-token windows: one warms, the others are timed.
        prefill = [workload.prefill(16384).cuda() for _ in range(max(2, (total - held_from) // 16384))]
        budget = layer_budget(rows_in_layer, args.cache_percent)
        results["cache_bytes_per_layer"] = budget
        for mode in ("none", "recency", "list+recency"):
            results["modes"][mode] = {}
            for kind in ("eager", "graph"):  # each on a cache of its own, learning from the same calls
                with EngramClient(endpoint=endpoint, device="cuda:0", timeout=600,
                                  hot_cache_bytes=0 if mode == "none" else budget * len(layouts)) as client:
                    if mode != "none":
                        install(client, layer, budget, ranked if mode == "list+recency" else None)
                    table = client.table(layer)
                    if kind == "graph":
                        results["modes"][mode]["decode_graph"] = run_graph(client, table, decode, args.warm, args.steps)
                    else:
                        results["modes"][mode]["decode"] = run_mode(client, table, decode, args.warm, args.steps)
                        results["modes"][mode]["prefill"] = run_mode(client, table, prefill, 1, len(prefill) - 1)
            print(mode, results["modes"][mode], flush=True)
        base = results["modes"]["none"]
        for mode in ("recency", "list+recency"):
            for kind in ("decode", "decode_graph", "prefill"):
                got = results["modes"][mode][kind]
                got["fetched_ratio"] = got["fetched_per_call"] / base[kind]["fetched_per_call"]
                got["time_ratio"] = got["median_ms"] / base[kind]["median_ms"]
        write_json(args.json, results)
        print(results)


if __name__ == "__main__":
    main()
