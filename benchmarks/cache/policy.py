"""The HBM hot-row cache's hit rate on text, its policy replayed on the CPU: warm-up length and the
policy against a true LRU of the same size.

    python -m benchmarks.cache.policy [--table-gib 32] [--cache-percent 1] [--text-mib 6]
        [--warm 100,500,1900] [--steps 60] [--check-kernels 30] [--json FILE]

No GPU and no daemon: the workload is benchmarks/cache/hot_cache.py's (the demo table's layout for
--table-gib, the text tokenized with DeepSeek-V4's tokenizer and hashed with the table's hash; the
first 70% of the tokens build the frequency list, decode steps of 256 sequences walk the last 30%),
and the cache is sized as hot_cache.py sizes it (1% of the layer's rows, half for the list's fixed
part when there is a list).  Replayed call by call:

  policy       the recency part as lookup/cache/kernels.py keeps it: WAYS ways a set, the set from the
               kernels' hash of the id, a hit stamps its way with the call's number, one miss a set
               per call (the last in the call) takes the way least recently stamped and not stamped
               by this call;
  true LRU     every distinct miss of a call inserted into one fully associative LRU of the same
               number of slots (the bound a set-associative, one-insert-a-set policy approaches).

--check-kernels N first runs the kernels themselves (classify and insert, lookup/cache/kernels.py) in
Triton's CPU interpreter over the first N calls beside the replay, and stops unless every id's hit
or miss and every way's key agree (needs Triton 3.9 or later installed).

Reported per warm-up length: the host rows a decode step fetches (misses, duplicates counted as
the gather counts them) over the ids it asks for, median of --steps steps after the warm-up, with
the recency part alone and with the list.  The GPU run (hot_cache.py, --warm 100) measured
0.589x / 0.570x on 6 MiB of code; issue 21's target is 0.55x.
"""
from __future__ import annotations

import argparse
import collections
import statistics

import numpy as np

from benchmarks.common import write_json
from benchmarks.cache.hot_cache import SPLIT, layer_budget, layer_counts
from engram_client.lookup.cache.row_cache import WAYS, part_sizes

MIX = np.int64(0x5851F42D4C957F2D)


def set_of(ids: np.ndarray, sets: int) -> np.ndarray:
    """kernels._set_of: int64 arithmetic, wrapping, shifts arithmetic."""
    with np.errstate(over="ignore"):
        h = ids.astype(np.int64) * MIX
    h = h ^ (h >> np.int64(29))
    return h & np.int64(sets - 1)


class Policy:
    """The recency part of lookup/cache/kernels.py, on the CPU."""

    def __init__(self, sets: int):
        self.sets = sets
        self.keys = np.full((self.sets, WAYS), -1, dtype=np.int64)
        self.stamps = np.zeros((self.sets, WAYS), dtype=np.int64)
        self.seq = 0

    def call(self, ids: np.ndarray) -> np.ndarray:
        """Whether each id hits; fills the ways as the kernels would."""
        self.seq += 1
        s = set_of(ids, self.sets)
        match = self.keys[s] == ids[:, None]
        hit = match.any(axis=1)
        rows, ways = np.nonzero(match)
        self.stamps[s[rows], ways] = self.seq
        miss_at = np.nonzero(~hit)[0]
        if miss_at.size:
            # The largest claim of a set wins: the call's last miss in it.
            last = {}
            for i in miss_at:
                last[s[i]] = i
            winners = np.fromiter(last.values(), dtype=np.int64)
            ws = s[winners]
            stamps = np.where(self.stamps[ws] == self.seq, np.iinfo(np.int64).max, self.stamps[ws])
            way = stamps.argmin(axis=1)
            put = stamps[np.arange(len(ws)), way] != np.iinfo(np.int64).max
            self.keys[ws[put], way[put]] = ids[winners[put]]
            self.stamps[ws[put], way[put]] = self.seq
        return hit


class TrueLru:
    def __init__(self, slots: int):
        self.slots, self.order = slots, collections.OrderedDict()

    def call(self, ids: np.ndarray) -> np.ndarray:
        order = self.order
        hit = np.fromiter((int(i) in order for i in ids), dtype=bool, count=ids.size)
        for i in ids.tolist():
            if i in order:
                order.move_to_end(i)
            else:
                order[i] = None
                if len(order) > self.slots:
                    order.popitem(last=False)
        return hit


def interpret_masks_as_bool() -> None:
    """Triton 3.9's interpreter refuses some masks it built itself (bool data under another dtype)
    in the cache's kernels; their arithmetic is untouched: the masks are cast to bool on the way in."""
    import triton.runtime.interpreter as interpreter

    builder = interpreter.InterpreterBuilder
    for name, at in (("create_masked_load", 1), ("create_masked_store", 2), ("create_atomic_rmw", 3)):
        def as_bool(self, *args, _orig=getattr(builder, name), _at=at):
            args = list(args)
            args[_at] = interpreter.TensorHandle(np.asarray(args[_at].data).astype(bool), args[_at].dtype)
            return _orig(self, *args)
        setattr(builder, name, as_bool)


def check_kernels(calls: list[np.ndarray], rows: int, sets: int) -> None:
    """The kernels in Triton's interpreter against Policy, call by call (recency part, no list)."""
    import os

    os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported
    import torch
    import triton

    from engram_client.lookup.cache import kernels
    from engram_client.lookup.cache.row_cache import POSITION_BITS

    interpret_masks_as_bool()
    policy = Policy(sets)
    keys = torch.full((sets * WAYS,), -1, dtype=torch.int64)
    stamps, claims = torch.zeros(sets * WAYS, dtype=torch.int64), torch.zeros(sets, dtype=torch.int64)
    control, no_fixed = torch.tensor([0, 0, 1, 0], dtype=torch.int64), torch.tensor([-5], dtype=torch.int64)
    for number, ids in enumerate(calls):
        n = ids.size
        slotmap, gather = torch.zeros(n, dtype=torch.int32), torch.zeros(n, dtype=torch.int64)
        kernels._classify_kernel[(triton.cdiv(n, kernels.CLASSIFY_BLOCK),)](
            torch.from_numpy(ids.copy()), n, 0, rows, no_fixed, 1, 1, keys, stamps, claims, sets, control, slotmap,
            gather, BLOCK=kernels.CLASSIFY_BLOCK, WAYS_=WAYS, POS_BITS=POSITION_BITS)
        kernels._insert_kernel[(triton.cdiv(n, kernels.INSERT_BLOCK),)](
            n, gather, slotmap, keys, stamps, claims, sets, control, BLOCK_R=kernels.INSERT_BLOCK, WAYS_=WAYS,
            POS_BITS=POSITION_BITS)
        differ = int(((slotmap.numpy() != -1) != policy.call(ids)).sum())
        if differ or not (keys.numpy().reshape(sets, WAYS) == policy.keys).all():
            raise SystemExit(f"call {number}: the replay and the kernels disagree on {differ} ids (or on the ways' keys)")
    print(f"the kernels in Triton's interpreter and the replay agree over {len(calls)} calls", flush=True)


def replay(calls: list[np.ndarray], fixed: np.ndarray, recency, warm: int, steps: int) -> float:
    """Median over the measured steps of misses / ids."""
    ratios = []
    for index, ids in enumerate(calls[:warm + steps]):
        in_fixed = np.isin(ids, fixed) if fixed.size else np.zeros(ids.size, dtype=bool)
        rest = ids[~in_fixed]
        hit = recency.call(rest) if rest.size else np.zeros(0, dtype=bool)
        if index >= warm:
            ratios.append((rest.size - int(hit.sum())) / ids.size)
    return statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-gib", type=float, default=32.0)
    parser.add_argument("--cache-percent", type=float, default=1.0)
    parser.add_argument("--text-mib", type=float, default=6.0)
    parser.add_argument("--warm", default="100,500,1900")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--check-kernels", type=int, default=0, metavar="CALLS")
    parser.add_argument("--json")
    args = parser.parse_args()

    import torch

    from engram_client.core.demo_rows import demo_config, demo_vocab_for_table_bytes
    from engram_client.core.layout import build_layout
    from engram_client.tools.bench_text import DECODE_SEQUENCES, TextWorkload, code_text

    layouts = build_layout(demo_config(vocab_size=demo_vocab_for_table_bytes(int(args.table_gib * 2**30))))
    layer = layouts[0]
    rows_in_layer = sum(layer.head_sizes)
    workload = TextWorkload(layouts, layer.layer, 4, text=code_text(int(args.text_mib * 2**20)) if args.text_mib else None)
    total = workload.tokens.numel()
    held_from = int(total * SPLIT)
    ranked = layer_counts(workload, workload.tokens[:held_from])
    workload._decode_at = held_from + torch.arange(DECODE_SEQUENCES) * ((total - held_from) // DECODE_SEQUENCES) + 4
    warms = [int(w) for w in args.warm.split(",")]
    if max(warms) + args.steps > (total - held_from) // DECODE_SEQUENCES:
        raise SystemExit(f"--warm {max(warms)} + --steps {args.steps}: the held-out text gives each of the "
                         f"{DECODE_SEQUENCES} sequences {(total - held_from) // DECODE_SEQUENCES} tokens before it "
                         "reaches the next one's; give more --text-mib or fewer steps")
    calls = [workload.decode().numpy().astype(np.int64) for _ in range(max(warms) + args.steps)]
    budget = layer_budget(rows_in_layer, args.cache_percent, layer.row_bytes)
    recency_sets = part_sizes(budget, layer.row_bytes, 0)[1]  # the recency part alone takes the whole budget
    if args.check_kernels:
        check_kernels(calls[:args.check_kernels], rows_in_layer, recency_sets)
    fixed_count, list_sets = part_sizes(budget, layer.row_bytes, len(ranked))  # as HbmRowCache splits it
    fixed = np.sort(ranked[:fixed_count])
    results = {"rows_in_layer": rows_in_layer, "tokens": total, "held_out": total - held_from, "text": workload.text,
               "cases": {}}
    print(f"layer {layer.layer}: {rows_in_layer:,} rows; cache {budget / 2**20:.0f} MiB; text {workload.text}, {total:,} tokens, "
          f"{total - held_from:,} held out; list {len(ranked):,} rows ({fixed.size:,} fit)", flush=True)
    print("| warm-up steps | recency part: policy | recency: true LRU | list + recency: policy | list + true LRU |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for warm in warms:
        row = {}
        for name, part, sets in (("recency", np.empty(0, np.int64), recency_sets), ("list+recency", fixed, list_sets)):
            row[f"{name} policy"] = replay(calls, part, Policy(sets), warm, args.steps)
            row[f"{name} true LRU"] = replay(calls, part, TrueLru(sets * WAYS), warm, args.steps)
        results["cases"][warm] = row
        print(f"| {warm} | {row['recency policy']:.3f}x | {row['recency true LRU']:.3f}x | "
              f"{row['list+recency policy']:.3f}x | {row['list+recency true LRU']:.3f}x |", flush=True)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
