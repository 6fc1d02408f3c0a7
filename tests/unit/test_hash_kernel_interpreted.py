"""The Triton hash kernel in Triton's CPU interpreter, against the CPU hash.

Exercises the kernel's sequence search, windows across sequence starts, history and
the handling of ids outside the vocabulary without a GPU; tests/gpu runs the compiled
kernel.  Needs Triton 3.9+ installed (skipped otherwise), and runs in a subprocess
because the interpreter is chosen when Triton is imported.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

triton = pytest.importorskip("triton")
if tuple(int(part) for part in triton.__version__.split(".")[:2]) < (3, 9):
    pytest.skip(f"Triton {triton.__version__}'s interpreter is not the one these kernels were checked with",
                allow_module_level=True)

SCRIPT = textwrap.dedent("""
    import numpy as np, torch
    from engram_client.hashing.hasher import hasher_for_config
    from engram_client.hashing.ngram_kernel import launch_ngram_hash
    from engram_client.core.layout import EngramConfig, build_layout, head_sizes
    fields = {"engram_vocab_size": [300, 500, 700], "engram_layer_ids": [3, 0], "engram_max_ngram_size": 4,
              "engram_n_heads": 5, "engram_head_dim": 32}
    probe = EngramConfig.from_dict({**fields, "engram_num_embeddings": 0})
    config = EngramConfig.from_dict({**fields, "engram_num_embeddings": [sum(s) for s in head_sizes(probe)]})
    rng = np.random.default_rng(0)
    token_map = np.minimum(np.arange(1000), 600).astype(np.int32)
    hasher = hasher_for_config(config, token_map, 601, pad_token_id=2)
    tables = [torch.from_numpy(a) for a in (hasher.token_map, hasher.multipliers, hasher.primes, hasher.offsets)]

    def gpu_style(tokens, starts, history, out_dtype=torch.int32):
        out = torch.full((tokens.numel(), 2, 15), 7, dtype=out_dtype)
        launch_ngram_hash(tokens, torch.tensor(starts, dtype=torch.int64), history, tables[0], hasher.pad_id,
                          tables[1], tables[2], tables[3], 4, 5, out)
        return out

    failures = 0
    for trial, starts in enumerate([[0], [0, 1, 2, 3], [0, 5, 130, 131, 250], list(range(0, 300, 7))]):
        tokens = torch.from_numpy(rng.integers(0, 1000, 300)).to(torch.int32 if trial % 2 else torch.int64)
        history = torch.from_numpy(rng.integers(-1, 1000, (len(starts), 3))) if trial >= 2 else None
        want = hasher.row_ids(tokens, starts, history)
        got = gpu_style(tokens, starts, history)
        failures += not torch.equal(got, want)
        failures += not torch.equal(gpu_style(tokens, starts, history, torch.int64), want.long())
        print(trial, torch.equal(got, want))
    tokens = torch.from_numpy(rng.integers(0, 1000, 300))
    tokens[10], tokens[200] = 1000, -5
    got = gpu_style(tokens, [0, 12], None)
    poisoned = sorted(set((got < 0).all(dim=2).all(dim=1).nonzero().flatten().tolist()))
    # Token 10 poisons itself and the next three of its sequence, but not the sequence from 12 on,
    # which starts fresh; token 200 poisons 200..203.
    print("poisoned", poisoned)
    failures += poisoned != [10, 11, 200, 201, 202, 203]
    clean = [i for i in range(300) if i not in poisoned]
    assert not (got[clean] < 0).any()
    assert failures == 0, failures
""")


def test_hash_kernel_in_the_interpreter_matches_the_cpu_hash():
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
