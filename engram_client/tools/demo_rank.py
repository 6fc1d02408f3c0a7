"""One demo DP rank: attach, look rows up, check every bit against the reference, report.

Run by ``engramd demo``; prints one JSON line with its report, then holds its lease
until its stdin closes (so the job can show every rank in status at once).
"""
from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time

import numpy as np
import torch

from engram_client import EngramClient, IdsOutOfRangeError
from engram_client.core.demo_rows import demo_rows
from engram_client.lookup.reference import reference_bf16_bits, same_bf16

from .demo_tokens import check_tokens

HOLD_TIMEOUT_S = 120.0


def check(table, out: torch.Tensor, ids: np.ndarray, seed: int) -> int:
    weight, scale = demo_rows(seed, table.layer, ids, table.head_dim)
    expected = reference_bf16_bits(weight, scale)
    actual = out.cpu().view(torch.int16).numpy().view(np.uint16).reshape(expected.shape)
    return int((~same_bf16(actual, expected)).sum())


def run(args) -> dict:
    rng = np.random.default_rng(1000 + args.rank)
    report = {"rank": args.rank, "device": args.device, "lookups": 0, "rows_checked": 0, "mismatches": 0}
    attach_started = time.perf_counter()
    with EngramClient(endpoint=args.socket, device=args.device, timeout=60.0, rank=args.rank) as client:
        report.update(client_id=client.client_id, pid=os.getpid(),
                      attach_seconds=round(time.perf_counter() - attach_started, 3))
        started = time.perf_counter()
        for i in range(args.lookups):
            layer = client.layers[i % len(client.layers)]
            table = client.table(layer)
            ids = rng.integers(0, table.num_rows, size=(args.ids // 4, 4))
            tensor_ids = torch.from_numpy(ids).to(client.device)
            out = table.prefetch(tensor_ids).wait() if i % 2 else table.lookup(tensor_ids)
            report["mismatches"] += check(table, out.reshape(-1, table.head_dim), ids.reshape(-1), args.seed)
            report["rows_checked"] += ids.size
            report["lookups"] += 1
        checked, mismatches = check_tokens(client, rng, args.seed, check)  # tokens -> rows, every layer
        report.update(token_rows_checked=checked, rows_checked=report["rows_checked"] + checked,
                      mismatches=report["mismatches"] + mismatches)
        report["seconds"] = round(time.perf_counter() - started, 3)
        table = client.table(client.layers[0])
        try:
            table.lookup(torch.tensor([0, table.num_rows, -1], device=client.device))
            report["out_of_range_refused"] = False
        except IdsOutOfRangeError:
            report["out_of_range_refused"] = True
        print(json.dumps(report), flush=True)
        # Hold the lease until the job has shown status, then detach on the way out.
        select.select([sys.stdin], [], [], HOLD_TIMEOUT_S)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lookups", type=int, default=20)
    parser.add_argument("--ids", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    report = run(parser.parse_args())
    ok = report["mismatches"] == 0 and report["out_of_range_refused"]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
