"""Hot reload: generation g+1 loads beside g, clients move when they choose, g's file goes."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from safetensors import safe_open

from engram_client import EngramClient, NotReadyError
from engramd.synth.writer import write_checkpoint
from exactness import assert_bf16_exact
from waiting import wait_for


def rows_of(ckpt: str, layer: int) -> tuple[np.ndarray, np.ndarray]:
    with safe_open(os.path.join(ckpt, "model.safetensors"), framework="pt") as f:
        weight = f.get_tensor(f"model.layers.{layer}.engram.embed.weight").view(torch.uint8).numpy()
        scale = f.get_tensor(f"model.layers.{layer}.engram.embed.scale").view(torch.uint8).numpy()
    return weight, scale


@pytest.fixture
def two_checkpoints(tmp_path):
    a, b = str(tmp_path / "ckpts" / "a"), str(tmp_path / "ckpts" / "b")
    write_checkpoint(a, vocab_size=400, head_dim=128, seed=1)
    write_checkpoint(b, vocab_size=400, head_dim=128, seed=2)
    return a, b


def test_reload_serves_g_until_g_plus_1_is_complete_then_clients_move(daemon_factory, two_checkpoints):
    a, b = two_checkpoints
    daemon = daemon_factory("--checkpoint", a, "--lease-seconds", "1.5")
    first = daemon.wait_state("ready")
    ids = np.arange(0, 1000, 7)
    client = EngramClient(endpoint=daemon.endpoint, device="cpu")
    try:
        assert_bf16_exact(client.table(1).lookup(torch.from_numpy(ids)), *[x[ids] for x in rows_of(a, 1)])
        started = daemon.connection.request("reload", {"checkpoint": b})
        assert started["generation"] == 2
        status = daemon.status()
        assert status["generation"] == 1 and status["state"] == "ready"  # g keeps serving meanwhile
        status = wait_for(lambda: (s := daemon.status())["generation"] == 2 and s, "generation 2 to be served")
        assert status["state"] == "ready" and status["reload"] is None and status["checkpoint"] == b
        assert status["table_path"] != first["table_path"]
        # The client still holds generation 1: its file stays, and its lookups still read a.
        assert os.path.exists(first["table_path"])
        held = {g["generation"]: g for g in status["generations"]}
        assert held[1]["retiring"] and held[1]["clients"] == 1
        wait_for(lambda: client.refresh_pending, "the heartbeat to notice generation 2")
        assert_bf16_exact(client.table(1).lookup(torch.from_numpy(ids)), *[x[ids] for x in rows_of(a, 1)])
        assert client.refresh() is True and client.generation == 2
        assert_bf16_exact(client.table(1).lookup(torch.from_numpy(ids)), *[x[ids] for x in rows_of(b, 1)])
        assert client.refresh() is False
        wait_for(lambda: not os.path.exists(first["table_path"]), "generation 1's file to go once nobody holds it")
        assert [c["generation"] for c in daemon.status()["clients"]] == [2]
    finally:
        client.close()


def test_auto_refresh_moves_before_the_next_lookup(daemon_factory, two_checkpoints):
    a, b = two_checkpoints
    daemon = daemon_factory("--checkpoint", a, "--lease-seconds", "0.9")
    daemon.wait_state("ready")
    with EngramClient(endpoint=daemon.endpoint, device="cpu", auto_refresh=True) as client:
        table = client.table(14)
        daemon.connection.request("reload", {"checkpoint": b})
        wait_for(lambda: daemon.status()["generation"] == 2, "generation 2")
        wait_for(lambda: client.refresh_pending, "the heartbeat to notice generation 2")
        ids = np.arange(50)
        assert_bf16_exact(table.lookup(torch.from_numpy(ids)), *[x[ids] for x in rows_of(b, 14)])
        assert client.generation == 2 and not client.refresh_pending


def test_failed_reload_keeps_g_serving_and_says_why(daemon_factory, two_checkpoints):
    a, b = two_checkpoints
    shard = os.path.join(b, "model.safetensors")
    os.truncate(shard, os.path.getsize(shard) - 1000)
    daemon = daemon_factory("--checkpoint", a)
    first = daemon.wait_state("ready")
    daemon.connection.request("reload", {"checkpoint": b})
    status = wait_for(lambda: (s := daemon.status())["reload"] and s["reload"]["state"] == "failed" and s,
                      "the reload to fail")
    assert "truncated" in status["reload"]["error"] and status["reload"]["generation"] == 2
    assert status["state"] == "ready" and status["generation"] == 1
    assert status["table_path"] == first["table_path"]
    assert daemon.table_files() == [os.path.basename(first["table_path"])], "a half-written generation is visible"
    with EngramClient(endpoint=daemon.endpoint, device="cpu") as client:
        ids = np.arange(20)
        assert_bf16_exact(client.table(1).lookup(torch.from_numpy(ids)), *[x[ids] for x in rows_of(a, 1)])


def test_reload_cannot_read_outside_the_reload_roots(daemon_factory, two_checkpoints, tmp_path):
    a, _ = two_checkpoints
    outside = str(tmp_path / "elsewhere")
    write_checkpoint(outside, vocab_size=100, head_dim=64)
    daemon = daemon_factory("--checkpoint", a)
    daemon.wait_state("ready")
    for path in (outside, "/etc", os.path.join(a, "..", "..", "elsewhere")):
        with pytest.raises(Exception, match="outside the reload roots"):
            daemon.connection.request("reload", {"checkpoint": path})
    assert daemon.status()["reload"] is None


def test_a_second_reload_during_a_load_is_refused(daemon_factory, two_checkpoints):
    a, b = two_checkpoints
    daemon = daemon_factory("--checkpoint", a, "--max-load-rate", "2")
    daemon.wait_state("ready", timeout=60)
    daemon.connection.request("reload", {"checkpoint": b})
    with pytest.raises(NotReadyError, match="already in progress"):
        daemon.connection.request("reload", {"checkpoint": a})


def test_retired_generation_goes_after_the_grace_period_even_if_held(daemon_factory, two_checkpoints):
    a, b = two_checkpoints
    daemon = daemon_factory("--checkpoint", a, "--retire-grace-seconds", "1")
    first = daemon.wait_state("ready")
    with EngramClient(endpoint=daemon.endpoint, device="cpu") as client:
        daemon.connection.request("reload", {"checkpoint": b})
        wait_for(lambda: daemon.status()["generation"] == 2, "generation 2")
        wait_for(lambda: not os.path.exists(first["table_path"]), "the grace period to end")
        ids = np.arange(30)  # the client never refreshed: its mapping of generation 1 still reads
        assert_bf16_exact(client.table(1).lookup(torch.from_numpy(ids)), *[x[ids] for x in rows_of(a, 1)])


def test_reload_cli_waits_for_the_new_generation(daemon_factory, two_checkpoints):
    import subprocess
    import sys

    a, b = two_checkpoints
    daemon = daemon_factory("--checkpoint", a)
    daemon.wait_state("ready")
    result = subprocess.run([sys.executable, "-m", "engramd", "reload", "--socket", daemon.endpoint,
                             "--checkpoint", b, "--wait", "60"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "generation 2 is served" in result.stdout
    assert daemon.status()["checkpoint"] == b


def test_refresh_onto_other_layers_keeps_the_clients_options(daemon_factory, tmp_path):
    a, c = str(tmp_path / "ckpts" / "a"), str(tmp_path / "ckpts" / "c")
    write_checkpoint(a, vocab_size=300, head_dim=128, layer_ids=[1, 14], seed=1)
    write_checkpoint(c, vocab_size=300, head_dim=128, layer_ids=[14, 20], seed=3)
    daemon = daemon_factory("--checkpoint", a)
    daemon.wait_state("ready")
    with EngramClient(endpoint=daemon.endpoint, device="cpu", lookup_strategy="direct", lookup_timeout=7.0) as client:
        old_layer_1 = client.table(1)
        daemon.connection.request("reload", {"checkpoint": c})
        wait_for(lambda: daemon.status()["generation"] == 2, "generation 2")
        assert client.refresh() is True
        assert client.layers == [14, 20]
        new_table = client.table(20)
        assert new_table.strategy == "direct" and new_table.wait_timeout == 7.0
        assert new_table.config is client.lookup_config and client.table(14).config is client.lookup_config
        with safe_open(os.path.join(c, "model.safetensors"), framework="pt") as f:
            weight = f.get_tensor("model.layers.20.engram.embed.weight").view(torch.uint8).numpy()
            scale = f.get_tensor("model.layers.20.engram.embed.scale").view(torch.uint8).numpy()
        ids = np.arange(0, new_table.num_rows, 5)
        assert_bf16_exact(new_table.lookup(torch.from_numpy(ids)), weight[ids], scale[ids])
        with pytest.raises(Exception, match="layer 1 is not in generation 2"):
            old_layer_1.lookup(torch.tensor([0]))
