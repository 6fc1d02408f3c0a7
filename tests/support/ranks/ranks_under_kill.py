"""Ranks looking up through a daemon's kill -9: what they must see is no error and exact rows.

Shared by the CPU test (tests/integration/test_faults.py) and its GPU twin
(tests/gpu/test_faults_gpu.py): the same rank program, only the device differs.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from waiting import wait_for

# A rank: attach on its device (argv[3]), look up in a loop checking every row, until told to stop.
# stdin: "killed" (the daemon is gone from now on), then "stop".  stdout: one JSON line
# when attached and warm, one with the counts at the end.
RANK = textwrap.dedent("""
    import json, sys, threading, time
    import numpy as np, torch
    from engram_client import EngramClient
    from engram_client.core.demo_rows import demo_rows
    from engram_client.lookup.reference import reference_bf16_bits, same_bf16

    endpoint, rank, device = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    counts = {"rank": rank, "lookups": 0, "exact": 0, "mismatch": 0, "after_kill": 0,
              "last_after_kill_s": 0.0, "max_gap_after_kill_s": 0.0, "errors": []}
    killed_at, stop = [], threading.Event()

    def control():
        for line in sys.stdin:
            if line.strip() == "killed":
                killed_at.append(time.monotonic())
            elif line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=control, daemon=True).start()
    try:
        client = EngramClient(endpoint=endpoint, device=device, rank=rank, timeout=30)
        tables = {layer: client.table(layer) for layer in client.layers}
        for table in tables.values():
            table.lookup(torch.arange(8))  # warm (a GPU rank compiles its kernel) before saying so
        print(json.dumps({"attached": client.client_id}), flush=True)
        rng, last = np.random.default_rng(rank), None
        while not stop.is_set():
            layer = client.layers[counts["lookups"] % len(client.layers)]
            ids = rng.integers(0, tables[layer].num_rows, 512)
            out = tables[layer].lookup(torch.from_numpy(ids)).cpu().view(torch.int16).numpy().view(np.uint16)
            exact = bool(same_bf16(out, reference_bf16_bits(*demo_rows(0, layer, ids, 256))).all())
            counts["lookups"] += 1
            counts["exact" if exact else "mismatch"] += 1
            now = time.monotonic()
            if killed_at:
                counts["after_kill"] += 1
                counts["last_after_kill_s"] = now - killed_at[0]
                gap = now - max(last if last is not None else killed_at[0], killed_at[0])
                counts["max_gap_after_kill_s"] = max(counts["max_gap_after_kill_s"], gap)
            last = now
        client.close()
    except BaseException as exc:
        counts["errors"].append(repr(exc))
    print(json.dumps(counts), flush=True)
""")


def run_ranks_through_a_kill(daemon, devices: list[str]) -> list[dict]:
    """Attach one rank per device to ``daemon`` (ready, short lease), kill -9 the daemon under
    them, and check that every rank went on looking up, exactly, for 3 s afterwards."""
    status = daemon.wait_state("ready")
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, daemon.endpoint, str(rank), device],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for rank, device in enumerate(devices)]
    try:
        attached = [json.loads(rank.stdout.readline() or "{}") for rank in ranks]  # bounded by the client's timeout
        assert all("attached" in line for line in attached), attached
        wait_for(lambda: len(daemon.status()["clients"]) == len(devices), "not every rank held a lease", 10)
        time.sleep(1.0)  # lookups under a live daemon

        daemon.kill(signal.SIGKILL)
        for rank in ranks:
            rank.stdin.write("killed\n")
            rank.stdin.flush()
        assert os.path.exists(status["table_path"]), "kill -9 cannot unlink the table"
        time.sleep(3.0)  # lookups with the daemon gone: heartbeats fail, the mappings must not
        for rank in ranks:
            rank.stdin.write("stop\n")
            rank.stdin.flush()
        results = []
        for rank in ranks:
            out, _ = rank.communicate(timeout=60)
            results.append(json.loads(out.strip().splitlines()[-1]))
            assert rank.returncode == 0, (rank.returncode, out)
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait(timeout=10)
    print("\n" + "\n".join(json.dumps(result) for result in results))
    for result in results:
        assert result["errors"] == [], result
        assert result["mismatch"] == 0 and result["exact"] == result["lookups"] > 0, result
        assert result["lookups"] > result["after_kill"], f"rank {result['rank']} made no lookup before the kill: {result}"
        assert result["after_kill"] > 0, f"rank {result['rank']} made no lookup after the kill: {result}"
        assert result["last_after_kill_s"] > 2.0, f"rank {result['rank']} stopped looking up after the kill: {result}"
    return results
