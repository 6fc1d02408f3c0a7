"""One rank process for the gather-budget tests: attach, wait for "go", look up, check every row.

    python tests/support/ranks/budget_rank.py ENDPOINT ROWS CALLS THREADS SEED [DEVICE [DECODE_PRIORITY]]

ROWS ids per call (uniform over layer 1, fresh each call; up to 8,192 of them checked), CALLS calls (0: until "stop" on
stdin), THREADS gather_threads (0: leave it to the budget), DECODE_PRIORITY the client's decode_priority
(normal).  stdout: one JSON line once attached ({"slot", "pid", "decode_priority", "words", "threads"}), one
at the end ({"calls", "exact", "mismatch", "stats", "errors"}); the checks use the demo table's own rows
(engram_client.core.demo_rows).
"""
from __future__ import annotations

import json
import os
import sys
import threading

import numpy as np
import torch

from engram_client import EngramClient
from engram_client.core.demo_rows import demo_rows
from engram_client.lookup.reference import reference_bf16_bits, same_bf16


def main() -> None:
    endpoint, rows, calls, threads, seed = sys.argv[1], *map(int, sys.argv[2:6])
    device = sys.argv[6] if len(sys.argv) > 6 else "cpu"
    decode_priority = sys.argv[7] if len(sys.argv) > 7 else "normal"
    stop = threading.Event()
    counts = {"calls": 0, "exact": 0, "mismatch": 0, "errors": [], "stats": None}
    try:
        client = EngramClient(endpoint=endpoint, device=device, timeout=30, gather_threads=threads or None,
                              lookup_path="host", decode_priority=decode_priority)
        table = client.table(1)
        table.lookup(torch.arange(8))
        seat = client._state.seat
        print(json.dumps({"slot": seat.budget.slot if seat.budget is not None else None, "pid": os.getpid(),
                          "decode_priority": list(seat.pool.decode_priority) if seat.pool is not None else None,
                          "words": client.gather_budget, "threads": client.lookup_config.gather_threads}),
              flush=True)
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("no go")
        threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
        rng = np.random.default_rng(seed)
        while not stop.is_set() and (calls == 0 or counts["calls"] < calls):
            ids = rng.integers(0, table.num_rows, rows)
            out = table.lookup(torch.from_numpy(ids)).cpu().view(torch.int16).numpy().view(np.uint16)
            # Up to 8,192 rows of each call checked: enough to catch any row gathered wrong, cheap
            # enough that a rank spends its time gathering rather than checking.
            pick = rng.choice(rows, min(rows, 8192), replace=False) if rows > 8192 else np.arange(rows)
            exact = bool(same_bf16(out[pick], reference_bf16_bits(*demo_rows(0, 1, ids[pick], 256))).all())
            counts["calls"] += 1
            counts["exact" if exact else "mismatch"] += 1
        counts["stats"] = seat.budget.stats() if seat.budget is not None else None
        client.close()
    except BaseException as exc:  # reported to the test
        counts["errors"].append(repr(exc))
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
