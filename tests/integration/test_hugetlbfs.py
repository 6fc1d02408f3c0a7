"""The table on hugetlbfs: no write(2) there, so the loader and every reader go through mappings."""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch
from safetensors import safe_open

from engram_client import EngramClient
from engramd.synth.writer import write_checkpoint
from exactness import assert_bf16_exact
from fake_sysfs import fake_sysfs
from hugetlbfs_mount import mounted_hugetlbfs

PAGES = 128  # 256 MiB of 2 MiB pages


@pytest.fixture
def hugetlbfs(tmp_path):
    """A 2 MiB-page hugetlbfs mount, with pages reserved for it (root only); restored afterwards."""
    with mounted_hugetlbfs(tmp_path / "hugetlbfs", PAGES) as mount:
        yield mount


def test_a_checkpoint_loads_serves_and_is_readopted_on_hugetlbfs(daemon_factory, hugetlbfs, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    write_checkpoint(ckpt, vocab_size=1500, head_dim=256, shards=2, seed=4)
    daemon = daemon_factory("--checkpoint", ckpt, shm=hugetlbfs)
    status = daemon.wait_state("ready")
    assert os.path.dirname(status["table_path"]) == hugetlbfs
    assert status["huge_pages"]["coverage"] == 1.0 and status["huge_pages"]["page_bytes"] == 2 << 20
    with safe_open(os.path.join(ckpt, "model-00001-of-00002.safetensors"), framework="pt") as f:
        weight = f.get_tensor("model.layers.1.engram.embed.weight").view(torch.uint8).numpy()
    with safe_open(os.path.join(ckpt, "model-00002-of-00002.safetensors"), framework="pt") as f:
        scale = f.get_tensor("model.layers.1.engram.embed.scale").view(torch.uint8).numpy()
    ids = np.arange(0, weight.shape[0], 11)
    with EngramClient(endpoint=daemon.endpoint, device="cpu") as client:
        assert_bf16_exact(client.table(1).lookup(torch.from_numpy(ids)), weight[ids], scale[ids])
    daemon.kill(signal.SIGKILL)
    again = daemon_factory("--checkpoint", ckpt, shm=hugetlbfs)
    readopted = again.wait_state("ready")
    assert readopted["adopted"] and readopted["table_path"] == status["table_path"]
    again.connection.request("stop")
    assert again.proc.wait(timeout=30) == 0
    assert not [name for name in os.listdir(hugetlbfs) if ".table" in name]


def test_numa_replicas_on_hugetlbfs_are_copied_through_mappings(daemon_factory, hugetlbfs, tmp_path, monkeypatch):
    """Two replicas on a hugetlbfs: no write(2) there, so the copy goes through the writer's mapping.
    The second NUMA node is a fake (ENGRAM_SYSFS_ROOT, nodes 0 and 1 of one CPU each); both
    replicas are bound to real node 0, this machine's only one (ENGRAMD_TEST_BIND_NODE)."""
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1 to stand for the two fake nodes")
    monkeypatch.setenv("ENGRAM_SYSFS_ROOT", fake_sysfs(tmp_path / "sys", {0: "0", 1: "1"}, {}))
    monkeypatch.setenv("ENGRAMD_TEST_BIND_NODE", "0")
    ckpt = str(tmp_path / "ckpt")
    write_checkpoint(ckpt, vocab_size=1500, head_dim=256, shards=1, seed=4)
    daemon = daemon_factory("--checkpoint", ckpt, "--numa-replicas", "all", shm=hugetlbfs)
    status = daemon.wait_state("ready")
    assert [r["node"] for r in status["replicas"]] == [0, 1]
    assert all(r["huge_pages"]["coverage"] == 1.0 for r in status["replicas"])
    ids = torch.arange(0, 4000, 13)
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {1})
    try:
        far = EngramClient(endpoint=daemon.endpoint, device="cpu")
    finally:
        os.sched_setaffinity(0, allowed)
    with far, EngramClient(endpoint=daemon.endpoint, device="cpu") as near:
        assert far.replica["node"] == 1 and far.replica["path"] == status["replicas"][1]["path"]
        assert near.replica["node"] == 0 and near.replica["path"] == status["table_path"]
        assert torch.equal(far.table(14).lookup(ids), near.table(14).lookup(ids))
    daemon.connection.request("stop")
