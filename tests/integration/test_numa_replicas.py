"""``engramd serve --numa-replicas``: a real daemon, real /dev/shm files, real clients.

This machine has one NUMA node.  The first test runs on it as it is: one replica.  The others
fake a second node: ENGRAM_SYSFS_ROOT points daemon and client at a temporary sysfs with nodes 0
(CPU 0) and 1 (CPU 1), and ENGRAMD_TEST_BIND_NODE=0 binds both replicas' memory to real node 0,
the only one there is; the files, the copies, the binding and the page checks are all real.
"""
from __future__ import annotations

import contextlib
import os
import signal
import urllib.request

import numpy as np
import pytest
import torch

from engram_client import EngramClient
from engram_client.core.demo_rows import demo_rows
from engramd.shm.numa import BoundMapping
from exactness import assert_bf16_exact
from fake_sysfs import fake_sysfs
from tmpfs_mount import mounted_tmpfs
from waiting import free_port, wait_for

IDS = np.arange(0, 5000, 7)


def pages_on(path: str, node: int) -> bool:
    """Every 16th page of the file is on ``node`` (get_mempolicy on this process's own mapping)."""
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        bound = BoundMapping(fd, size, node, path)
    finally:
        os.close(fd)
    try:
        return all(bound.node_of(offset) == node for offset in range(0, size, 16 * 4096))
    finally:
        bound.close()


@contextlib.contextmanager
def on_cpus(cpus: set[int]):
    """This process may run only on ``cpus`` meanwhile: a CPU rank's node is that of its CPUs."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@pytest.fixture
def two_nodes(tmp_path, monkeypatch):
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1 to stand for the two fake nodes")
    monkeypatch.setenv("ENGRAM_SYSFS_ROOT", fake_sysfs(tmp_path / "sys", {0: "0", 1: "1"}, {}))
    monkeypatch.setenv("ENGRAMD_TEST_BIND_NODE", "0")


def test_one_node_machine_serves_one_replica_at_todays_path(daemon_factory):
    daemon = daemon_factory("--numa-replicas", "all")
    status = daemon.wait_state("ready")
    assert [(r["node"], r["path"]) for r in status["replicas"]] == [(0, status["table_path"])]
    assert daemon.table_files() == [os.path.basename(status["table_path"])]  # the name it has without the flag
    assert status["replicas"][0]["bytes"] == status["table_bytes"] and status["replicas"][0]["huge_pages"]
    assert pages_on(status["table_path"], 0)
    with EngramClient(endpoint=daemon.endpoint, device="cpu") as client:
        assert client.replica == {"node": 0, "path": status["table_path"], "rank_node": 0}
        assert daemon.status()["clients"][0]["replica"] == {"node": 0, "path": status["table_path"]}
        assert_bf16_exact(client.table(1).lookup(torch.from_numpy(IDS)), *demo_rows(0, 1, IDS, 256))


def test_two_nodes_give_two_replicas_and_each_rank_maps_its_own(daemon_factory, two_nodes):
    port = free_port()
    daemon = daemon_factory("--numa-replicas", "all", "--metrics-port", str(port))
    status = daemon.wait_state("ready")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        samples = dict(line.rsplit(" ", 1) for line in response.read().decode().splitlines() if line[:1] != "#")
    for node in (0, 1):
        assert float(samples[f'engramd_replica_bytes{{node="{node}"}}']) == status["table_bytes"]
        huge = status["replicas"][node]["huge_pages"]["huge_bytes"]
        assert float(samples[f'engramd_replica_huge_page_bytes{{node="{node}"}}']) == huge
    first, second = status["replicas"]
    assert (first["node"], first["path"]) == (0, status["table_path"])
    assert second["node"] == 1 and second["path"].endswith("-g1-n1.table") and second["bytes"] == status["table_bytes"]
    assert pages_on(first["path"], 0) and pages_on(second["path"], 0)  # both bound to real node 0 (see above)
    with on_cpus({1}):
        far = EngramClient(endpoint=daemon.endpoint, device="cpu", rank=1)
    with on_cpus({0}):
        near = EngramClient(endpoint=daemon.endpoint, device="cpu", rank=0)
    with far, near:
        assert far.replica == {"node": 1, "path": second["path"], "rank_node": 1}
        assert near.replica == {"node": 0, "path": first["path"], "rank_node": 0}
        listed = {c["rank"]: (c["numa_node"], c["replica"]) for c in daemon.status()["clients"]}
        assert listed == {0: (0, {"node": 0, "path": first["path"]}), 1: (1, {"node": 1, "path": second["path"]})}
        for client in (far, near):
            assert_bf16_exact(client.table(14).lookup(torch.from_numpy(IDS)), *demo_rows(0, 14, IDS, 256))
    assert "replica for NUMA node 1: 32.0 MiB copied" in daemon.log()


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_crash_readopts_the_good_replica_and_rebuilds_the_other_before_serving(daemon_factory, two_nodes, damage):
    first = daemon_factory("--numa-replicas", "all")
    before = first.wait_state("ready")
    good, broken = (r["path"] for r in before["replicas"])
    first.kill(signal.SIGKILL)
    inode = os.stat(broken).st_ino
    if damage == "truncated":
        os.truncate(broken, os.stat(broken).st_size // 2)
    else:
        os.unlink(broken)
    again = daemon_factory("--numa-replicas", "all")  # the same endpoint: the same instance, its files
    after = again.wait_state("ready")
    assert after["adopted"] and after["generation"] == before["generation"]
    assert [r["path"] for r in after["replicas"]] == [good, broken]
    assert os.stat(broken).st_size == before["table_bytes"] and os.stat(broken).st_ino != inode  # a new file
    log = again.log()
    assert "replica for NUMA node 1" in log and "rebuilt the replica for NUMA node 1" in log
    with on_cpus({1}), EngramClient(endpoint=again.endpoint, device="cpu") as client:
        assert client.replica["path"] == broken
        assert_bf16_exact(client.table(1).lookup(torch.from_numpy(IDS)), *demo_rows(0, 1, IDS, 256))


def test_a_reload_retires_every_replica_of_the_old_generation_together(daemon_factory, two_nodes):
    daemon = daemon_factory("--numa-replicas", "all")
    old = daemon.wait_state("ready")
    with on_cpus({1}):
        client = EngramClient(endpoint=daemon.endpoint, device="cpu")
    with client:
        assert client.replica["path"] == old["replicas"][1]["path"]
        daemon.connection.request("reload", {}, timeout=10)
        wait_for(lambda: daemon.status()["generation"] == 2 and daemon.status()["state"] == "ready",
                 "generation 2 served", 60)
        new = daemon.status()
        assert sorted(daemon.table_files()) == sorted(os.path.basename(r["path"]) for r in
                                                      old["replicas"] + new["replicas"])  # the client holds g1
        assert client.refresh()
        assert client.replica["path"] == new["replicas"][1]["path"] and client.generation == 2
        wait_for(lambda: len(daemon.table_files()) == 2, "generation 1's replicas removed")
        assert daemon.table_files() == sorted(os.path.basename(r["path"]) for r in new["replicas"])
        assert_bf16_exact(client.table(1).lookup(torch.from_numpy(IDS)), *demo_rows(0, 1, IDS, 256))


def test_the_free_space_check_counts_every_replica(daemon_factory, two_nodes, tmp_path):
    with mounted_tmpfs(tmp_path / "small", "size=48M") as small:  # one 32 MiB table fits, two do not
        daemon = daemon_factory("--numa-replicas", "all", shm=small)
        status = daemon.wait_state("failed")
        assert "2 NUMA replicas of 32.0 MiB" in status["error"] and "needs 64.0 MiB" in status["error"], status
        assert daemon.table_files() == []
        daemon.stop()
        alone = daemon_factory(shm=small, name="alone")
        assert alone.wait_state("ready")["table_bytes"] == 32 << 20
        alone.stop()


def test_a_replica_cut_under_the_daemon_fails_the_generation_naming_it(daemon_factory, two_nodes):
    daemon = daemon_factory("--numa-replicas", "all")
    replica = daemon.wait_state("ready")["replicas"][1]["path"]
    os.truncate(replica, 4096)
    status = daemon.status()
    assert status["state"] == "failed"
    assert f"its table file (the replica for NUMA node 1) {replica} was truncated" in status["error"], status["error"]
