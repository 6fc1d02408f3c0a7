"""vLLM stand-in ranks (tests/vllm_standin/replay_rank.py) as real processes, and the checkpoints they load.

Shared by the CPU test (tests/integration/test_vllm_plugin.py) and its GPU twin
(tests/gpu/test_vllm_plugin_gpu.py): the same rank program and checkpoints, only the device differs.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_standin")
RANK_PROGRAM = os.path.join(STANDIN, "replay_rank.py")
# 3 heads per n-gram order, orders 2..4: 9 heads a layer, so TP 2 splits them 5 + 4 and vLLM pads
# the second rank with one zero head; 256 wide as in V4.1.  A few thousand rows a layer.
LAYOUT = {"layer_ids": (1, 14), "max_ngram": 4, "n_heads": 3, "head_dim": 256}


def write_checkpoints(root: str) -> dict[str, str]:
    """engramd's checkpoint, one of another layout (vocabulary), one of the same layout with other rows."""
    from engramd.synth.writer import write_checkpoint

    paths = {"served": os.path.join(root, "served"), "other_layout": os.path.join(root, "other-layout"),
             "other_weights": os.path.join(root, "other-weights")}
    write_checkpoint(paths["served"], vocab_size=200, seed=0, shards=2, **LAYOUT)
    write_checkpoint(paths["other_layout"], vocab_size=300, seed=0, **LAYOUT)
    write_checkpoint(paths["other_weights"], vocab_size=200, seed=1, **LAYOUT)
    return paths


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_ranks(out_dir: str, endpoint: str, checkpoints: dict[str, str], scenarios: list[str], tp: int, dp: int,
              device: str, timeout: float = 180.0) -> list[dict]:
    """Start tp x dp ranks (ENGRAMD_VLLM=1, ENGRAMD_SOCKET=endpoint) and return each one's outcomes."""
    env = {**os.environ, "ENGRAMD_VLLM": "1", "ENGRAMD_SOCKET": endpoint, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (STANDIN, os.environ.get("PYTHONPATH")) if p)}
    env.pop("VLLM_PLUGINS", None)
    port = _free_port()
    ranks = []
    for rank in range(tp * dp):
        spec = {"rank": rank, "tp": tp, "dp": dp, "port": port, "device": device, "scenarios": scenarios,
                "checkpoint": checkpoints["served"], "other_layout": checkpoints["other_layout"],
                "other_weights": checkpoints["other_weights"], "out": os.path.join(out_dir, f"rank{rank}.json"),
                "missing_socket": f"ipc://{out_dir}/no-daemon-here.sock"}
        ranks.append(subprocess.Popen([sys.executable, "-P", RANK_PROGRAM, json.dumps(spec)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for process in ranks:
            outputs.append(process.communicate(timeout=timeout)[0])
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
    failed = [(rank, process.returncode, output) for rank, (process, output) in enumerate(zip(ranks, outputs))
              if process.returncode != 0]
    assert not failed, "\n".join(f"rank {rank} exited {code}:\n{output}" for rank, code, output in failed)
    results = []
    for rank in range(tp * dp):
        with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
            results.append(json.load(f))
    return results
