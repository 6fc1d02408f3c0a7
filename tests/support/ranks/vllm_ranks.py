"""vLLM stand-in ranks (tests/support/vllm_standin/replay_rank.py) as real processes, and the checkpoints they load.

Shared by the CPU test (tests/integration/test_vllm_plugin.py) and its GPU twin
(tests/gpu/test_vllm_plugin_gpu.py): the same rank program and checkpoints, only the device differs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from waiting import free_port, wait_for
from rank_exit import finish

SUPPORT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/support: the helpers, the stand-in
STANDIN = os.path.join(SUPPORT, "vllm_standin")
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


def start_ranks(out_dir: str, endpoint: str, checkpoints: dict[str, str], scenarios: list[str], tp: int, dp: int,
                device: str, version: str = "0.33.0", env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    """Start tp x dp ranks of the stand-in for vLLM ``version`` (ENGRAMD_VLLM=1, ENGRAMD_SOCKET=endpoint)."""
    full = {**os.environ, "ENGRAMD_VLLM": "1", "ENGRAMD_SOCKET": endpoint, "OMP_NUM_THREADS": "1",
            "STANDIN_VLLM_VERSION": version, **(env or {}),
            "PYTHONPATH": os.pathsep.join(p for p in (STANDIN, SUPPORT, os.environ.get("PYTHONPATH")) if p)}
    full.pop("VLLM_PLUGINS", None)
    port = free_port()
    ranks = []
    for rank in range(tp * dp):
        spec = {"rank": rank, "tp": tp, "dp": dp, "port": port, "device": device, "scenarios": scenarios,
                "checkpoint": checkpoints["served"], "other_layout": checkpoints["other_layout"],
                "other_weights": checkpoints["other_weights"], "out": os.path.join(out_dir, f"rank{rank}.json"),
                "missing_socket": f"ipc://{out_dir}/no-daemon-here.sock", "hold_dir": out_dir}
        ranks.append(subprocess.Popen([sys.executable, "-P", RANK_PROGRAM, json.dumps(spec)], env=full,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return ranks


def collect_ranks(out_dir: str, ranks: list[subprocess.Popen], timeout: float = 180.0) -> list[dict]:
    """Each rank's outcomes, once every rank exited 0 (killed, with its output shown, if not within ``timeout``)."""
    finish(ranks, timeout)
    results = []
    for rank in range(len(ranks)):
        with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
            results.append(json.load(f))
    return results


def run_ranks(out_dir: str, endpoint: str, checkpoints: dict[str, str], scenarios: list[str], tp: int, dp: int,
              device: str, version: str = "0.33.0", env: dict[str, str] | None = None) -> list[dict]:
    """Start tp x dp ranks and return each one's outcomes."""
    return collect_ranks(out_dir, start_ranks(out_dir, endpoint, checkpoints, scenarios, tp, dp, device, version, env))


def restart_daemon_under(ranks: list[subprocess.Popen], hold_dir: str, daemon, *args: str, timeout: float = 120.0):
    """Once every rank waits in its ``daemon_restart`` scenario: kill -9 ``daemon`` (a tests/conftest.py
    DaemonProcess), start another with ``args`` on its socket and shm dir, and let the ranks go on.
    Returns the new daemon and its first ready status."""
    from conftest import DaemonProcess

    try:
        wait_for(lambda: all(os.path.exists(os.path.join(hold_dir, f"held-{rank}")) for rank in range(len(ranks)))
                 or any(process.poll() is not None for process in ranks), "every rank to wait for the restart", timeout)
        daemon.kill()
        daemon.stop()
        daemon = DaemonProcess(os.path.dirname(daemon.endpoint[len("ipc://"):]), daemon.shm_dir, *args).start()
        return daemon, daemon.wait_state("ready")
    except BaseException:
        for process in ranks:  # the caller will not collect them
            process.kill()
            process.wait(timeout=10)
        raise
    finally:
        open(os.path.join(hold_dir, "go"), "w").close()  # a rank never waits past a failed restart
