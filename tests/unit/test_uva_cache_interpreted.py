"""The UVA path through the HBM row cache returns exactly the rows of the UVA path without it, in
Triton's CPU interpreter: the classify, fetch, serve, insert and move kernels call after call, so
the recency part fills and serves, with a fixed part from a list, ids out of range counted and
zeroed alike, int32 and int64 ids, capped and uncapped grids, a whole layer and a registered
range.  Then the table's bytes of every cached row are overwritten: a cached lookup still returns
the rows it cached, so hits really are served from HBM and never read over PCIe.

Needs Triton 3.9+ (as test_lookup_kernels_interpreted.py); the compiled kernels run in
tests/gpu/test_lookup_gpu.py and tests/gpu/test_hot_cache_gpu.py."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

triton = pytest.importorskip("triton")
if tuple(int(part) for part in triton.__version__.split(".")[:2]) < (3, 9):
    pytest.skip(f"Triton {triton.__version__}'s interpreter cannot run these kernels; needs 3.9+",
                allow_module_level=True)

SCRIPT = textwrap.dedent("""
    import numpy as np, torch
    from benchmarks.cache.policy import interpret_masks_as_bool
    from engram_client.lookup.uva import cached_lookup as C, lookup_kernel as L
    from engram_client.lookup.cache.kernels import CacheKernels
    from engram_client.lookup.cache.row_cache import HbmRowCache
    from engram_client.lookup.config import LookupConfig
    from engram_client.lookup.dequant import dequantize_rows
    interpret_masks_as_bool()
    L._check = C._check = lambda *args: None  # the launchers' device checks want CUDA; this runs on the CPU
    rng = np.random.default_rng(0)
    rows, head_dim, row_bytes, cpu = 500, 256, 264, torch.device("cpu")
    raw = rng.integers(0, 256, rows * row_bytes, dtype=np.uint8)
    raw[(raw & 0x7F) == 0x7F] = 0x11  # the interpreter does not model E4M3 NaN
    table = torch.from_numpy(raw)
    table.view(rows, row_bytes)[:, 256:] = torch.from_numpy(rng.integers(110, 140, (rows, 8), dtype=np.uint8))
    listed = np.array([3, 1, 4, 15, 9, 2, 6, 5, 35, 8], dtype=np.int64)  # a fixed part of 10 rows
    cache = HbmRowCache(2 * 10 * (row_bytes + 8) + 4 * 8 * (row_bytes + 16), head_dim, row_bytes, 0, rows, cpu, listed)
    cache.load_fixed(None, table, 0, rows, None)
    assert (cache.fixed_count, cache.sets) == (10, 4), (cache.fixed_count, cache.sets)
    kernels = CacheKernels(cache, torch.bfloat16, cpu)
    failures, calls = 0, 0
    for trial, (max_programs, block_rows, dtype) in enumerate([(None, 16, torch.int64), (5, 64, torch.int32),
                                                                (1, 32, torch.int64), (3, 128, torch.int32)] * 2):
        n = 300 + trial * 77
        ids = torch.from_numpy(rng.zipf(1.3, n) % (rows + 6) - 3).to(dtype)
        config = LookupConfig(block_rows=block_rows, max_programs=max_programs)
        results = []
        for cached in (False, True):
            out = torch.full((n, head_dim), 99.0, dtype=torch.bfloat16)
            bad = torch.zeros(1, dtype=torch.int32)
            if cached:
                C.launch_cached_lookup(table, ids, out, bad, 0, rows, head_dim, row_bytes, config, cache, kernels, None)
                calls += 1
            else:
                L.launch_lookup(table, ids, out, bad, 0, rows, head_dim, row_bytes, config)
            results.append((out, int(bad)))
        (plain, plain_bad), (cached, cached_bad) = results
        valid = (ids >= 0) & (ids < rows)
        expected = dequantize_rows(table.view(rows, row_bytes)[ids.long().clamp(0, rows - 1)], head_dim)
        expected[~valid] = 0
        exact = torch.equal(cached.view(torch.int16), plain.view(torch.int16)) and \\
            torch.equal(plain.view(torch.int16), expected.view(torch.int16))
        counted = cached_bad == plain_bad == int((~valid).sum())
        failures += (not exact) + (not counted)
        print(n, max_programs, block_rows, dtype, exact, counted)
    recent = cache.recent_keys[cache.recent_keys >= 0]
    assert int(cache.control[0]) == calls, "every cached call committed its sequence number"
    assert recent.numel() > 0, "the recency part never filled"
    assert failures == 0, failures
    held = torch.cat([cache.fixed_keys, recent])
    before = dequantize_rows(table.view(rows, row_bytes)[held], head_dim)
    table.view(rows, row_bytes)[held] = 0x22  # another row, had the table changed: the cache must not see it
    out = torch.empty((held.numel(), head_dim), dtype=torch.bfloat16)
    C.launch_cached_lookup(table, held, out, torch.zeros(1, dtype=torch.int32), 0, rows, head_dim, row_bytes,
                           LookupConfig(), cache, kernels, None)
    assert torch.equal(out.view(torch.int16), before.view(torch.int16)), "a cached row was read from the table"
    print("cached rows served from HBM:", held.numel())
    # A registered range (a tensor-parallel rank's rows): the view starts at row_lo, ids stay absolute.
    lo, hi = 100, 400
    view = table[lo * row_bytes:hi * row_bytes]
    part = HbmRowCache(2 * 10 * (row_bytes + 8) + 4 * 8 * (row_bytes + 16), head_dim, row_bytes, lo, hi, cpu,
                       np.arange(120, 140, dtype=np.int64))
    part.load_fixed(None, view, lo, hi, None)
    part_kernels = CacheKernels(part, torch.bfloat16, cpu)
    for call in range(4):
        ids = torch.from_numpy(lo + rng.zipf(1.3, 400) % (hi - lo + 40) - 20)
        outs = [torch.full((ids.numel(), head_dim), 99.0, dtype=torch.bfloat16) for _ in range(2)]
        bads = [torch.zeros(1, dtype=torch.int32) for _ in range(2)]
        L.launch_lookup(view, ids, outs[0], bads[0], lo, hi, head_dim, row_bytes, LookupConfig())
        C.launch_cached_lookup(view, ids, outs[1], bads[1], lo, hi, head_dim, row_bytes, LookupConfig(), part,
                               part_kernels, None)
        outside = int(((ids < lo) | (ids >= hi)).sum())
        assert outside and int(bads[0]) == int(bads[1]) == outside, (call, bads, outside)
        assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), f"registered range, call {call}"
    assert int((part.recent_keys >= 0).sum()) > 0
""")


def test_the_uva_path_with_the_cache_returns_the_rows_of_the_path_without_it():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get(
        "PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
