"""How the bench times: events around a call on the caller's stream, host time on its thread,
and the slowdown of a model's matmul loop while lookups are prefetched beside it.

bench.py times every method with ``timed``; ``measure_overlap`` is the overlap measure it
reports for each lookup path (benchmarks/lookups/grid.py uses both for its grid).
"""
from __future__ import annotations

import statistics
import time

import torch

from .bench_ids import SIZES, IdSampler


def timed(fn, stream) -> tuple[float, float]:
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


def time_ms(fn, stream) -> float:
    return timed(fn, stream)[0]


def summary(samples: list[float], host: list[float] | None = None) -> dict:
    result = {"median_ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples)}
    if host:
        result["host_ms"] = statistics.median(host)
    return result


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
    return {"steps": steps, "matmuls_per_step": 4, "alone_ms": summary(alone), "with_prefetch_ms": summary(together),
            "lookups_ms": summary(finished),
            "matmul_step_ms": per_step_alone,
            "slowdown": statistics.median(together) / statistics.median(alone) - 1.0}
