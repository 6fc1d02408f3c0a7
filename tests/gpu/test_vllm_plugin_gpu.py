"""engramd's vLLM plugin on CUDA: vLLM 0.33.0's call sequence as TP 2 x DP 2, four processes on one GPU.

The GPU twin of tests/integration/test_vllm_plugin.py, with the same stand-in for vLLM's GPU
paths (tests/vllm_standin): ids on the GPU, each rank's lookups on engramd's host path from
``Engram._start_prefetch`` on the layers' shared prefetch stream, waited for in ``_ready_rows``,
eagerly and inside one captured CUDA graph replayed on new ids (vLLM's FULL mode), every head
compared bit for bit with the checkpoint after the TP gather.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from conftest import DaemonProcess
from vllm_ranks import run_ranks, write_checkpoints

pytestmark = pytest.mark.gpu


def test_tp2_dp2_ranks_on_one_gpu_get_bit_exact_rows_eagerly_and_from_a_captured_graph(tmp_path):
    checkpoints = write_checkpoints(str(tmp_path))
    socket_dir = tempfile.mkdtemp(prefix="engt-")
    shm_dir = tempfile.mkdtemp(prefix="engt-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    daemon = DaemonProcess(socket_dir, shm_dir, "--checkpoint", checkpoints["served"]).start()
    try:
        daemon.wait_state("ready")
        ranks = run_ranks(socket_dir, daemon.endpoint, checkpoints, ["serve", "graph"], tp=2, dp=2, device="cuda:0")
    finally:
        daemon.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)
        shutil.rmtree(shm_dir, ignore_errors=True)
    for rank, outcome in enumerate(ranks):
        serve, graph = outcome["serve"], outcome["graph"]
        assert serve["lookup_device"] == "cuda:0", rank
        assert serve["exact"] and serve["padding_zero"], (rank, serve["mismatches"])
        assert serve["registered"] == serve["vllm_rows"] and serve["params_on_meta"], rank
        assert graph["replays"] == 2 and graph["exact"] and graph["padding_zero"], (rank, graph["mismatches"])
