"""engramd's vLLM plugin on CUDA: vLLM 0.33.0's and 0.34.0's call sequences as TP 2 x DP 2, four processes on one GPU.

The GPU twin of tests/integration/test_vllm_plugin.py, with the same stand-in for vLLM's GPU
paths (tests/support/vllm_standin): ids on the GPU, each rank's lookups on engramd's host path from
``Engram._start_prefetch`` on the layers' shared prefetch stream, waited for in ``_ready_rows``,
eagerly and inside one captured CUDA graph replayed on new ids (vLLM's FULL mode; the last
replay with DEAD_ID among them), every head compared bit for bit with the checkpoint after the
TP gather; DEAD ids and an id outside the rank's rows on GPU ids; the specialized decode's WKV
chain reading engramd's rows from its side stream; the daemon killed and restarted under the
running ranks, and the graph captured after that.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from conftest import DaemonProcess
from vllm_ranks import collect_ranks, restart_daemon_under, start_ranks, write_checkpoints

pytestmark = pytest.mark.gpu
# The graph last: the eager scenarios then never wait on an event last recorded inside its capture.
SCENARIOS = ["serve", "dead_ids", "decode_chain", "daemon_restart", "graph"]


# uva: ENGRAMD_DECODE_PATH, the ranks' decode-size calls (eager and in the graph) on the UVA kernel
@pytest.mark.parametrize("version, decode_path", [("0.33.0", ""), ("0.34.0", ""), ("0.34.0", "uva")])
def test_tp2_dp2_ranks_on_one_gpu_get_bit_exact_rows_eagerly_from_a_graph_and_through_a_daemon_restart(
        tmp_path, version, decode_path):
    checkpoints = write_checkpoints(str(tmp_path))
    socket_dir = tempfile.mkdtemp(prefix="engt-")
    shm_dir = tempfile.mkdtemp(prefix="engt-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    args = ("--checkpoint", checkpoints["served"], "--lease-seconds", "0.9")
    daemon = DaemonProcess(socket_dir, shm_dir, *args).start()
    try:
        daemon.wait_state("ready")
        ranks = start_ranks(socket_dir, daemon.endpoint, checkpoints, SCENARIOS, 2, 2, "cuda:0", version,
                            {"STANDIN_AVAILABLE_MEMORY": str(64 << 10), "ENGRAMD_DECODE_PATH": decode_path})
        daemon, _ = restart_daemon_under(ranks, socket_dir, daemon, *args, timeout=300.0)
        outcomes = collect_ranks(socket_dir, ranks, timeout=300.0)
    finally:
        daemon.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)
        shutil.rmtree(shm_dir, ignore_errors=True)
    for rank, outcome in enumerate(outcomes):
        serve, graph, dead, chain = outcome["serve"], outcome["graph"], outcome["dead_ids"], outcome["decode_chain"]
        assert serve["lookup_device"] == "cuda:0" and serve["replayed"] == version, rank
        assert serve["exact"] and serve["padding_zero"], (rank, serve["mismatches"])
        assert serve["registered"] == serve["vllm_rows"] and serve["params_on_meta"], rank
        assert serve["host_numa_calls"] == 0 and serve["dp_shared_memory"], rank
        assert graph["replays"] == 3 and graph["exact"] and graph["padding_zero"], (rank, graph["mismatches"])
        assert dead["mixed"]["exact"] and dead["after_error"]["exact"], (rank, dead["mixed"]["mismatches"])
        assert dead["dummy_layers_looked_up"] == (2 if version == "0.34.0" else 0), rank
        assert version == "0.33.0" or dead["dummy_rows_zero"], rank
        assert "IdsOutOfRangeError" in dead["bad_id_error"] and "outside" in dead["bad_id_error"], dead
        assert chain["chained_layers"] == 2 and chain["exact"], (rank, chain["mismatches"])
        restart = outcome["daemon_restart"]
        assert restart["exact"] and restart["boot_ids"][0] != restart["boot_ids"][1], rank
