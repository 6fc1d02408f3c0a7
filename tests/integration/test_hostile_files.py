"""Checkpoints that change under a load or between two daemons, and restarts after a reload to another checkpoint."""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import numpy as np
import torch
from safetensors import safe_open

from engram_client import EngramClient
from engramd.synth.writer import write_checkpoint
from exactness import assert_bf16_exact
from waiting import wait_for


def test_checkpoint_overwritten_in_place_during_a_load_fails_it(daemon_factory, tmp_path):
    served, other = str(tmp_path / "ckpts" / "a"), str(tmp_path / "other")
    write_checkpoint(served, vocab_size=2000, head_dim=256, seed=1)
    write_checkpoint(other, vocab_size=2000, head_dim=256, seed=2)
    shard = os.path.join(served, "model.safetensors")
    replacement = open(os.path.join(other, "model.safetensors"), "rb").read()
    assert os.path.getsize(shard) == len(replacement)
    # 8 MB/s: the second layer's copy starts ~1.6 s after the first, so the overwrite lands in between.
    daemon = daemon_factory("--checkpoint", served, "--max-load-rate", "8")
    wait_for(lambda: daemon.status()["load"]["done_bytes"] > 0, "the load to copy its first chunk", 60)
    with open(shard, "r+b") as f:  # like `dd conv=notrunc`: same inode, same size, new bytes
        f.write(replacement)
    status = daemon.wait_state("ready", "failed", timeout=120)
    assert status["state"] == "failed", "a checkpoint changed mid-load was served"
    assert shard in status["error"] and "changed during the load" in status["error"]
    assert not [name for name in daemon.table_files() if name.endswith(".table")]


def test_restart_after_a_reload_serves_the_reload_target(daemon_factory, tmp_path):
    a, b, c = (str(tmp_path / "ckpts" / name) for name in "abc")
    for seed, path in enumerate((a, b, c)):
        write_checkpoint(path, vocab_size=300, head_dim=128, seed=seed)
    daemon = daemon_factory("--checkpoint", a)
    daemon.wait_state("ready")
    daemon.connection.request("reload", {"checkpoint": b})
    wait_for(lambda: daemon.status()["generation"] == 2 and daemon.status()["state"] == "ready",
             "the reload to b to be served", 60)
    daemon.kill()

    again = daemon_factory("--checkpoint", a)  # the unit's command line still says a
    status = again.wait_state("ready")
    assert status["checkpoint"] == os.path.realpath(b) and status["generation"] == 2 and status["adopted"]
    again.kill()

    # An operator who changes --checkpoint on purpose gets what they asked for.
    third = daemon_factory("--checkpoint", c)
    status = third.wait_state("ready")
    assert status["checkpoint"] == os.path.realpath(c)
    third.stop()
    assert os.path.isdir(a) and os.path.isdir(b)  # nothing but table files is ever removed


def layer_rows(ckpt: str, layer: int) -> tuple[np.ndarray, np.ndarray]:
    with safe_open(os.path.join(ckpt, "model.safetensors"), framework="pt") as f:
        weight = f.get_tensor(f"model.layers.{layer}.engram.embed.weight").view(torch.uint8).numpy()
        scale = f.get_tensor(f"model.layers.{layer}.engram.embed.scale").view(torch.uint8).numpy()
    return weight, scale


def test_a_shard_rewritten_in_place_with_its_mtime_restored_is_loaded_again_not_readopted(daemon_factory, tmp_path):
    served, newer = str(tmp_path / "ckpts" / "a"), str(tmp_path / "newer")
    write_checkpoint(served, vocab_size=300, head_dim=128, seed=1)
    write_checkpoint(newer, vocab_size=300, head_dim=128, seed=2)  # same layout and size, other rows
    daemon = daemon_factory("--checkpoint", served)
    first = daemon.wait_state("ready")
    daemon.kill()
    shard, replacement = os.path.join(served, "model.safetensors"), os.path.join(newer, "model.safetensors")
    before = os.stat(shard)
    subprocess.run(["touch", "-r", shard, replacement], check=True, timeout=60)  # give it the old mtime
    subprocess.run(["cp", "-p", replacement, shard], check=True, timeout=60)  # in place, mtime kept
    after = os.stat(shard)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)

    again = daemon_factory("--checkpoint", served)
    status = again.wait_state("ready")
    assert not status["adopted"] and status["fingerprint"] != first["fingerprint"]
    ids = np.arange(0, 300, 7)
    with EngramClient(endpoint=again.endpoint, device="cpu") as client:
        assert_bf16_exact(client.table(1).lookup(torch.from_numpy(ids)), *[x[ids] for x in layer_rows(newer, 1)])
