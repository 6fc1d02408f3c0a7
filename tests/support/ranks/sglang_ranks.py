"""SGLang stand-in ranks (tests/support/sglang_standin/replay_rank.py) as real processes, and the checkpoints they load.

Shared by the CPU test (tests/integration/test_sglang_plugin.py) and its GPU twin
(tests/gpu/test_sglang_plugin_gpu.py): the same rank program and checkpoints, only the device differs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from waiting import free_port  # noqa: F401 (the test imports it from here)
from rank_exit import finish  # noqa: F401 (the tests import it from here)

STANDIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sglang_standin")
RANK_PROGRAM = os.path.join(STANDIN, "replay_rank.py")
# 4 heads per n-gram order, orders 2..3: 8 hash columns a layer, so TP 2 gives each rank 4 whole
# columns (SGLang's shard_range on column boundaries); 256 wide as in V4.1.  A few thousand rows a layer.
LAYOUT = {"layer_ids": (1, 14), "max_ngram": 3, "n_heads": 4, "head_dim": 256}


def write_checkpoints(root: str) -> dict[str, str]:
    """engramd's checkpoint, one of another layout (vocabulary), one of the same layout with other rows."""
    from engramd.synth.writer import write_checkpoint

    paths = {name: os.path.join(root, name) for name in ("served", "other_layout", "other_weights")}
    write_checkpoint(paths["served"], vocab_size=200, seed=0, shards=2, **LAYOUT)
    write_checkpoint(paths["other_layout"], vocab_size=300, seed=0, **LAYOUT)
    write_checkpoint(paths["other_weights"], vocab_size=200, seed=1, **LAYOUT)
    return paths


def rank_env(endpoint: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, "ENGRAMD_SGLANG": "1", "ENGRAMD_SOCKET": endpoint, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (STANDIN, os.environ.get("PYTHONPATH")) if p), **extra}
    env.pop("SGLANG_PLUGINS", None)
    return env


def start_rank(spec: dict, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-P", RANK_PROGRAM, json.dumps(spec)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def rank_spec(rank: int, tp: int, dp: int, port: int, device: str, scenarios: list[str], out_dir: str,
              checkpoints: dict[str, str], **extra) -> dict:
    return {"rank": rank, "tp": tp, "dp": dp, "port": port, "device": device, "scenarios": scenarios,
            "checkpoint": checkpoints["served"], "other_layout": checkpoints["other_layout"],
            "other_weights": checkpoints["other_weights"], "out": os.path.join(out_dir, f"rank{rank}.json"),
            "go": os.path.join(out_dir, "go"), "missing_socket": f"ipc://{out_dir}/no-daemon-here.sock", **extra}


def outcome(process: subprocess.Popen, path: str, scenario: str, timeout: float) -> dict:
    """The rank's outcomes once ``scenario``'s is written; a rank that exits first fails with its output."""
    deadline = time.monotonic() + timeout
    while True:
        if os.path.exists(path):
            with open(path) as f:
                outcomes = json.load(f)
            if scenario in outcomes:
                return outcomes
        if process.poll() is not None and process.returncode != 0:
            raise AssertionError(f"rank exited {process.returncode} before {scenario}:\n{process.stdout.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no outcome of {scenario} in {path} within {timeout:.0f} s")
        time.sleep(0.05)
