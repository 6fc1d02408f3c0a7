"""engramd's SGLang plugin on CUDA: SGLang 0.5.23's call sequence as TP 2 x DP 2, four processes on one GPU.

The GPU twin of tests/integration/test_sglang_plugin.py, with the same stand-in for SGLang
(tests/support/sglang_standin): hash ids on the GPU, every layer looked up as ``Engram.forward`` does
(``_owned_rows`` on engramd's host path, then the TP all-reduce), SGLang's pad rows and dead
ids included, compared bit for bit; then each rank's ``_owned_rows`` of every layer captured in
one CUDA graph on the current stream (as SGLang's decode graphs capture the Engram lookup) and
replayed twice on new ids written into the captured buffer, compared again.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from conftest import DaemonProcess
from sglang_ranks import finish, free_port, outcome, rank_env, rank_spec, start_rank, write_checkpoints

pytestmark = pytest.mark.gpu
TP, DP = 2, 2


@pytest.mark.parametrize("decode_path", ["", "uva"])  # uva: ENGRAMD_DECODE_PATH, decode-size calls on the kernel
def test_tp2_dp2_ranks_on_one_gpu_get_sglangs_rows_eagerly_and_from_a_captured_graph(tmp_path, decode_path):
    checkpoints = write_checkpoints(str(tmp_path))
    socket_dir = tempfile.mkdtemp(prefix="engt-")
    shm_dir = tempfile.mkdtemp(prefix="engt-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    daemon = DaemonProcess(socket_dir, shm_dir, "--checkpoint", checkpoints["served"]).start()
    try:
        daemon.wait_state("ready")
        port, env = free_port(), {**rank_env(daemon.endpoint), "ENGRAMD_DECODE_PATH": decode_path}
        specs = [rank_spec(rank, TP, DP, port, "cuda:0", ["serve", "graph"], str(tmp_path), checkpoints)
                 for rank in range(TP * DP)]
        ranks = [start_rank(spec, env) for spec in specs]
        finish(ranks, timeout=300)
        outcomes = [outcome(process, spec["out"], "graph", 5) for process, spec in zip(ranks, specs)]
    finally:
        daemon.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)
        shutil.rmtree(shm_dir, ignore_errors=True)
    for rank, result in enumerate(outcomes):
        serve, graph = result["serve"], result["graph"]
        assert serve["lookup_device"] == "cuda:0", rank
        assert serve["mismatches"] == [] and serve["registered"] == serve["sglang_rows"], (rank, serve)
        assert serve["params_on_meta"] and not serve["stager"], rank
        assert graph["replays"] == 2 and graph["mismatches"] == [], (rank, graph["mismatches"])
