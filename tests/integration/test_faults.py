"""The daemon killed with SIGKILL at the worst moments: mid-load, and under attached ranks.

A daemon is trusted only if nothing it does can take an inference rank down or lose
a table.  kill -9 runs no cleanup, so what is on /dev/shm and what the ranks see is
exactly what the daemon's write order guarantees:

    - mid-load: only a ``*.partial`` file exists, no client can attach to it, and the
      next daemon on the same socket and shm dir removes it and loads afresh, bit-exact;
    - under ranks: their mappings stay valid, lookups go on, exact, with no exception.
"""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch
from safetensors import safe_open

from engram_client import DaemonUnavailableError, EngramClient, EngramTimeoutError, NotReadyError
from engram_client.core.table_file import read_header
from engram_client.core.errors import TableFileError
from engramd.synth.writer import write_checkpoint
from exactness import assert_bf16_exact
from ranks_under_kill import run_ranks_through_a_kill
from waiting import wait_for


def checkpoint_tensors(directory) -> dict[str, np.ndarray]:
    tensors = {}
    for name in os.listdir(directory):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(directory, name), framework="pt") as f:
                for key in f.keys():
                    if ".engram.embed." in key:
                        tensors[key] = f.get_tensor(key).view(torch.uint8).numpy()
    return tensors


def test_kill_9_mid_load_leaves_only_a_partial_that_the_next_daemon_replaces(daemon_factory, tmp_path):
    ckpt = tmp_path / "ckpt"
    write_checkpoint(str(ckpt), vocab_size=3000, head_dim=256, seed=17)  # two layers of ~19 MB each
    # At 2 MB/s the first layer's chunk goes at once and the second waits ~9 s: a load caught in the middle.
    first = daemon_factory("--checkpoint", str(ckpt), "--max-load-rate", "2", "--load-threads", "2")
    first.wait_state("loading", timeout=30)

    def loading_with_progress():
        status = first.status(timeout=2.0)
        assert status["state"] == "loading", f"the load ended before the kill: {status['state']}"
        return status if status["load"]["done_bytes"] > 0 else None

    status = wait_for(loading_with_progress, "the load never showed progress", 30)
    assert status["load"]["done_bytes"] < status["load"]["total_bytes"], "the load finished before the kill"
    assert status["table_path"] is None
    files = first.table_files()
    assert len(files) == 1 and files[0].endswith(".partial"), files
    partial = os.path.join(first.shm_dir, files[0])
    with pytest.raises(NotReadyError):  # the protocol refuses an attach while loading
        first.connection.request("attach", {"pid": os.getpid(), "device": "cpu"})
    with pytest.raises(EngramTimeoutError, match="state loading"):
        EngramClient(endpoint=first.endpoint, device="cpu", timeout=1.0)

    first.kill(signal.SIGKILL)
    assert first.table_files() == files, "kill -9 mid-load must leave only the partial file"
    with pytest.raises(TableFileError, match="not complete"):  # even mapped by hand, it is refused
        read_header(partial)
    with pytest.raises(EngramTimeoutError, match="is stale: nothing listens on it"):
        EngramClient(endpoint=first.endpoint, device="cpu", timeout=1.0)
    with pytest.raises(DaemonUnavailableError):
        first.connection.request("status", timeout=0.5)
    assert first.table_files() == files

    second = daemon_factory("--checkpoint", str(ckpt))  # same socket, same shm dir
    ready = second.wait_state("ready", timeout=120)
    assert ready["boot_id"] != status["boot_id"]
    assert not os.path.exists(partial), "the next daemon left the dead one's partial file"
    assert second.table_files() == [os.path.basename(ready["table_path"])]
    assert ready["load"]["done_bytes"] == ready["load"]["total_bytes"] == status["load"]["total_bytes"]
    header, _ = read_header(ready["table_path"])
    assert header.total_bytes == os.path.getsize(ready["table_path"])

    tensors = checkpoint_tensors(ckpt)
    with EngramClient(endpoint=second.endpoint, device="cpu", timeout=30) as client:
        for layer in client.layers:
            table = client.table(layer)
            ids = np.random.default_rng(layer).integers(0, table.num_rows, 300)
            ids[:2] = 0, table.num_rows - 1
            weight = tensors[f"model.layers.{layer}.engram.embed.weight"][ids]
            scale = tensors[f"model.layers.{layer}.engram.embed.scale"][ids]
            assert_bf16_exact(table.lookup(torch.from_numpy(ids)), weight, scale)


def test_ranks_keep_exact_lookups_when_the_daemon_is_killed(daemon_factory):
    run_ranks_through_a_kill(daemon_factory("--lease-seconds", "1.5"), ["cpu"] * 3)
