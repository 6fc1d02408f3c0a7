"""`engramd bench`: lookup speed on the GPU against naive baselines and the PCIe ceiling.

For each call size (6,144 / 49,152 / 393,216 rows: decode of 256 tokens, prefill of
2K and 16K tokens, 24 heads) and each id distribution (uniform; Zipf s=1.1 within
each head), with fresh ids for every method and iteration, one run times:
  copy         a plain copy of the same number of bytes from the registered table: the ceiling;
  naive        torch.index_select on UVA views of weight and scale bytes, then torch dequantization;
  naive-words  the same packed rows read as 4-byte words by one index_select (about 2x the bytes
               version), then torch dequantization;
  ours:host    engram_client's host-gather path (CPU threads gather, the copy engine moves rows,
               a small kernel dequantizes in HBM), ids on the GPU; "host:host-ids": ids in host memory;
  ours:uva:... the UVA kernel, for each strategy and grid cap asked for, ids on the GPU;
               "uva:host-ids": the default UVA table with ids in host memory.
Each method reports the GPU-visible time (events around the call on the caller's stream) and
the host time the call spent on the caller's thread.  Useful bytes are rows x 264 B whatever a
method moves.  The overlap measure is how much a bf16 matmul loop on the main stream slows
while 393,216-row lookups for the next step are prefetched beside it, for each path.
docs/BENCHMARKS.md records a run; ``--markdown`` prints the tables to paste there.
"""
from __future__ import annotations

import statistics
from dataclasses import replace
import subprocess
import sys
import tempfile
import time

import torch

from engram_client import EngramClient
from engram_client.hot_rows import HotRowCache
from engram_client.demo_rows import demo_vocab_for_table_bytes
from engram_client.dequant import dequantize_rows, scale_factors

SIZES = (6144, 49152, 393216)
ZIPF_S = 1.1


class IdSampler:
    """Fresh ids per call: token t, head h -> a row of head h (uniform, or Zipf within the head).

    Zipf ranks are mapped to rows by r -> (a*r + b) mod p, a bijection since head sizes are
    prime: popular n-grams land at scattered rows, as hashing puts them."""

    def __init__(self, table, device, max_cdf_rows: int = 1 << 24):
        self.sizes = torch.tensor(table.head_sizes, device=device, dtype=torch.int64)
        self.offsets = torch.tensor(table.head_offsets, device=device, dtype=torch.int64)
        self.device = device
        n = min(int(self.sizes.max()), max_cdf_rows)
        weights = torch.arange(1, n + 1, device=device, dtype=torch.float64).pow(-ZIPF_S)
        self.cdf = (weights.cumsum(0) / weights.sum()).to(torch.float64)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(1234)

    def sample(self, rows: int, distribution: str) -> torch.Tensor:
        heads = torch.arange(rows, device=self.device) % len(self.sizes)
        size = self.sizes[heads]
        if distribution == "uniform":
            u = torch.rand(rows, device=self.device, dtype=torch.float64, generator=self.generator)
            local = (u * size).long().clamp_(max=size - 1)
        else:
            u = torch.rand(rows, device=self.device, dtype=torch.float64, generator=self.generator)
            rank = torch.searchsorted(self.cdf, u).clamp_(max=self.cdf.numel() - 1)
            local = (rank * 2654435761 + 97) % size
        return self.offsets[heads] + local


def naive_lookup(weight_view: torch.Tensor, scale_view: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    w = torch.index_select(weight_view, 0, ids)
    s = torch.index_select(scale_view, 0, ids)
    values = w.view(torch.float8_e4m3fn).to(torch.float32)
    n, d = values.shape
    return (values.view(n, d // 32, 32) * scale_factors(s).unsqueeze(-1)).view(n, d).to(torch.bfloat16)


def naive_words_lookup(words_view: torch.Tensor, ids: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The packed rows as int32 words [rows, row_bytes / 4]: one index_select moves whole rows."""
    rows = torch.index_select(words_view, 0, ids).view(torch.uint8)
    return dequantize_rows(rows, head_dim)


def _time_ms(fn, stream) -> float:
    return _timed(fn, stream)[0]


def _timed(fn, stream) -> tuple[float, float]:
    """(GPU-visible ms on ``stream``, ms the call spent on this thread)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record(stream)
    began = time.perf_counter()
    fn()
    host = (time.perf_counter() - began) * 1e3
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end), host


def _summary(samples: list[float], host: list[float] | None = None) -> dict:
    summary = {"median_ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples)}
    if host:
        summary["host_ms"] = statistics.median(host)
    return summary


def _with_config(table, **options):
    """The table with other lookup options (one frozen config: replaced, never changed)."""
    return replace(table, config=replace(table.config, **options))


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
        cache = HotRowCache.for_budget(int(hot_cache_gib * 2**30), table.head_dim, table.out_dtype, device)
        tables[f"uva:auto/p{table.max_programs or 'all'}+cache"] = replace(uva, hot_cache=cache)
    status = client.status()
    rows_view = table.rows_view.view(-1, table.layout.row_bytes)
    weight_view, scale_view = rows_view[:, :table.head_dim], rows_view[:, table.head_dim:]
    words_view = table.rows_view.view(torch.int32).view(-1, table.layout.row_bytes // 4)
    row_bytes = table.layout.row_bytes
    sampler = IdSampler(table, device)
    stream = torch.cuda.current_stream(device)
    results = {"table_bytes": status["table_bytes"], "layer": layer, "rows": table.num_rows,
               "gpu": torch.cuda.get_device_name(device), "iterations": iterations,
               "gather_threads": client.lookup_config.gather_threads, "cases": []}
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
        for distribution in ("uniform", "zipf"):
            nbytes = rows * row_bytes
            samples = {key: ([], []) for key in ("copy", *methods)}
            distinct = []
            dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
            for t in tables.values():
                if t.hot_cache is not None:  # learn this distribution from calls before the timed ones
                    t.hot_cache.clear()
                    for _ in range(t.hot_cache.refresh_every):
                        t.prefetch(sampler.sample(rows, distribution)).wait()
            for it in range(iterations + 1):  # the first iteration warms up and checks; it is dropped
                ids = sampler.sample(rows, distribution)
                distinct.append(int(torch.unique(ids).numel()))
                offset = int(torch.randint(0, flat_bytes.numel() - nbytes, (1,))) // 4096 * 4096
                timings = {"copy": _timed(lambda: dst.copy_(flat_bytes[offset:offset + nbytes]), stream)}
                # Each method gets ids of its own: ids another method just fetched would find the
                # translation caches warm and flatter whoever runs second.
                for key, (call, from_host) in methods.items():
                    fresh = sampler.sample(rows, distribution)
                    fresh = fresh.cpu() if from_host else fresh
                    timings[key] = _timed(lambda: call(fresh), stream)
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
            case = {"rows": rows, "distribution": distribution, "useful_bytes": nbytes,
                    "distinct_rows_median": statistics.median(distinct[1:]),
                    **{key: _summary(*v) for key, v in samples.items()}}
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


def measure_overlap(table, sampler: IdSampler, steps: int) -> dict:
    """Slowdown of a bf16 matmul loop while next-step lookups (16K-token prefill) run on the side."""
    device = sampler.device
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    stream = torch.cuda.current_stream(device)
    ids = [sampler.sample(SIZES[-1], "uniform") for _ in range(steps)]

    def loop(with_lookups: bool) -> float:
        """Main-stream time of the matmul loop; lookups (if any) are waited for only after it."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record(stream)
        handles = []
        for step in range(steps):
            if with_lookups:
                handles.append(table.prefetch(ids[step]))
            for _ in range(4):
                torch.matmul(a, b)
        end.record(stream)
        for handle in handles:
            handle.wait()
        done = torch.cuda.Event(enable_timing=True)
        done.record(stream)
        torch.cuda.synchronize()
        return start.elapsed_time(end), start.elapsed_time(done)

    loop(False)
    loop(True)
    alone, runs = [], []
    for _ in range(7):  # alternated, so that clock or thermal drift cannot favour either
        alone.append(loop(False)[0])
        runs.append(loop(True))
    together, finished = [r[0] for r in runs], [r[1] for r in runs]
    per_step_alone = statistics.median(alone) / steps
    return {"steps": steps, "matmuls_per_step": 4, "alone_ms": _summary(alone), "with_prefetch_ms": _summary(together),
            "lookups_ms": _summary(finished),
            "matmul_step_ms": per_step_alone,
            "slowdown": statistics.median(together) / statistics.median(alone) - 1.0}


def print_table(results: dict) -> None:
    print(f"{results['gpu']}: layer {results['layer']} of a {results['table_bytes'] / 2**30:.1f} GiB table, "
          f"median of {results['iterations']} iterations, fresh ids each; {results['gather_threads']} gather threads")
    print(f"{'rows':>7} {'ids':<8} {'distinct':>8} {'method':<26} {'median ms':>10} {'min':>8} {'max':>8} "
          f"{'host ms':>8} {'useful GB/s':>11} {'x naive':>8} {'t / copy':>8}")
    for case in results["cases"]:
        for key in [k for k in case if k in ("copy", "naive", "naive-words") or k.startswith("ours:")]:
            m = case[key]
            print(f"{case['rows']:>7} {case['distribution']:<8} {case['distinct_rows_median']:>8.0f} {key:<26} "
                  f"{m['median_ms']:10.3f} {m['min_ms']:8.3f} {m['max_ms']:8.3f} {m.get('host_ms', 0):8.3f} "
                  f"{m['useful_GBps']:11.1f} {m['speedup_vs_naive']:8.2f} {m['vs_copy_time']:8.2f}")
    for o in results["overlap"]:
        print(f"overlap, {o['path']} path{'' if o['path'] == 'host' else ', max_programs ' + str(o['max_programs'] or 'all')}"
              f": matmul loop {o['alone_ms']['median_ms']:.2f} ms alone, {o['with_prefetch_ms']['median_ms']:.2f} ms "
              f"with 393,216-row lookups prefetched each step: slowdown {o['slowdown'] * 100:.1f}%, lookups done "
              f"{o['lookups_ms']['median_ms']:.2f} ms after start")


def start_daemon(table_gib: float, load_threads: int) -> tuple[subprocess.Popen, str, str]:
    socket_dir = tempfile.mkdtemp(prefix="engramd-bench-")
    shm_dir = tempfile.mkdtemp(prefix="engramd-bench-", dir="/dev/shm")
    vocab = demo_vocab_for_table_bytes(int(table_gib * 2**30))
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    proc = subprocess.Popen([sys.executable, "-m", "engramd", "serve", "--socket", endpoint, "--shm-dir", shm_dir,
                             "--demo-vocab-size", str(vocab), "--load-threads", str(load_threads),
                             "--no-progress", "--log-level", "warning"])
    return proc, endpoint, shm_dir


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
            proc.terminate()
            proc.wait(timeout=120)
