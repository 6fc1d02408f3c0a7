"""The Triton lookup kernels run in Triton's CPU interpreter, against the torch dequantizer.

This exercises the kernels' indexing, masking, strided grids and dedup without a GPU (the
HBM row cache's kernels: test_uva_cache_interpreted.py).  It needs Triton installed (GPU environments have it; the CPU test
environment need not), and is skipped otherwise.  The interpreter does not model E4M3
NaN, so the table here holds no NaN bytes; tests/gpu covers NaN on real hardware.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

triton = pytest.importorskip("triton")
if tuple(int(part) for part in triton.__version__.split(".")[:2]) < (3, 9):
    # Older interpreters fail on scalar reductions these kernels use (seen with 3.6);
    # the compiled kernels are covered by tests/gpu on real hardware.
    pytest.skip(f"Triton {triton.__version__}'s interpreter cannot run these kernels; needs 3.9+",
                allow_module_level=True)

SCRIPT = textwrap.dedent("""
    import numpy as np, torch
    from engram_client.lookup.uva import lookup_kernel as L
    from engram_client.lookup.dequant import dequantize_rows
    from engram_client.lookup.config import LookupConfig
    L._check = lambda *args: None  # the launchers' device checks want CUDA; the interpreter runs on CPU
    rng = np.random.default_rng(0)
    rows, head_dim, row_bytes = 500, 256, 264
    raw = rng.integers(0, 256, rows * row_bytes, dtype=np.uint8)
    raw[(raw & 0x7F) == 0x7F] = 0x11
    table = torch.from_numpy(raw)
    table.view(rows, row_bytes)[:, 256:] = torch.from_numpy(rng.integers(110, 140, (rows, 8), dtype=np.uint8))
    failures = 0
    for trial, (max_programs, block_rows) in enumerate([(None, 16), (5, 64), (1, 32), (3, 128)]):
        n = 300 + trial * 77
        ids = torch.from_numpy(rng.zipf(1.3, n) % (rows + 6) - 3).long()
        valid = (ids >= 0) & (ids < rows)
        expected = dequantize_rows(table.view(rows, row_bytes)[ids.clamp(0, rows - 1)], head_dim)
        expected[~valid] = 0
        for launch in (L.launch_lookup, L.launch_lookup_dedup):
            out = torch.full((n, head_dim), 99.0, dtype=torch.bfloat16)
            bad = torch.zeros(1, dtype=torch.int32)
            launch(table, ids, out, bad, 0, rows, head_dim, row_bytes,
                   LookupConfig(block_rows=block_rows, max_programs=max_programs))
            exact = bool((out.view(torch.int16) == expected.view(torch.int16)).all())
            counted = int(bad) == int((~valid).sum())
            failures += (not exact) + (not counted)
            print(launch.__name__, n, max_programs, block_rows, exact, counted)
    assert failures == 0, failures
""")


def test_kernels_in_the_interpreter_match_the_torch_dequantizer():
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
