"""NUMA replicas: which nodes get one, which one a rank maps, and where a replica's pages are.

This machine has one NUMA node.  Node selection runs on a fake sysfs root (a temporary directory
with devices/system/node/nodeN/cpulist and bus/pci/devices/<address>/{vendor,class,numa_node}):
it is a fake for a second NUMA node, which cannot exist here; ENGRAMD_TEST_BIND_NODE=0 then lets
the planner accept node 1, whose memory would be real node 0.  The binding itself is real:
mbind(MPOL_BIND) on a real /dev/shm mapping, checked page by page with get_mempolicy.
"""
from __future__ import annotations

import os

import pytest
import torch

from engram_client.core.errors import ConfigError, ProtocolError, TableFileError
from engram_client.core.numa_nodes import cpu_rank_node, node_cpus, pick_replica
from engram_client.lookup.host.gather_seat import rank_node
from engramd.daemon.replicas import check_placement, plan_nodes
from engramd.shm.numa import BoundMapping, present_nodes
from fake_sysfs import fake_sysfs

PAGE = os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def bind_to_node_0(monkeypatch):
    monkeypatch.setenv("ENGRAMD_TEST_BIND_NODE", "0")  # the fake node 1 has no memory of its own here


def test_all_means_every_node_with_gpus(tmp_path, bind_to_node_0):
    two_sockets = fake_sysfs(tmp_path / "a", {0: "0-7", 1: "8-15"},
                             {"0000:18:00.0": 0, "0000:3b:00.0": 0, "0000:86:00.0": 1, "0000:af:00.0": 1})
    assert plan_nodes("all", two_sockets) == [0, 1]
    one_socket_of_gpus = fake_sysfs(tmp_path / "b", {0: "0-7", 1: "8-15"}, {"0000:86:00.0": 1})
    assert plan_nodes("all", one_socket_of_gpus) == [1]
    no_gpus = fake_sysfs(tmp_path / "c", {0: "0-7", 1: "8-15"}, {})
    assert plan_nodes("all", no_gpus) == [0, 1]  # CPU ranks on either node


def test_named_nodes_must_exist(tmp_path, bind_to_node_0):
    sysfs = fake_sysfs(tmp_path, {0: "0-7", 1: "8-15"}, {})
    assert plan_nodes("1", sysfs) == [1]
    assert plan_nodes("0,1", sysfs) == [0, 1]
    with pytest.raises(ConfigError, match="no NUMA node 2"):
        plan_nodes("0,2", sysfs)
    with pytest.raises(ConfigError, match="--numa-replicas"):
        plan_nodes("zero", sysfs)


def test_without_a_test_binding_a_node_the_kernel_lacks_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("ENGRAMD_TEST_BIND_NODE", raising=False)
    sysfs = fake_sysfs(tmp_path, {0: "0-7", 1: "8-15"}, {})
    missing = max(present_nodes() or [0]) + 1
    with pytest.raises(ConfigError, match=f"--numa-replicas {missing}: no such NUMA node"):
        plan_nodes("all" if missing == 1 else str(missing), sysfs)


def test_a_rank_maps_its_nodes_replica_else_the_first(tmp_path):
    sysfs = fake_sysfs(tmp_path, {0: "0-7", 1: "8-15"}, {})
    assert node_cpus(sysfs) == {0: list(range(8)), 1: list(range(8, 16))}
    assert cpu_rank_node({9, 10, 11}, sysfs) == 1
    assert cpu_rank_node({6, 7, 8}, sysfs) == 0  # most of its CPUs
    replicas = [{"node": 0, "path": "/s/t.table"}, {"node": 1, "path": "/s/t-n1.table"}]
    assert pick_replica(replicas, "/s/t.table", 1) == {"node": 1, "path": "/s/t-n1.table"}
    assert pick_replica(replicas, "/s/t.table", 3) == {"node": 0, "path": "/s/t.table"}
    assert pick_replica(replicas, "/s/t.table", None)["path"] == "/s/t.table"
    assert pick_replica(None, "/s/t.table", 1) == {"node": None, "path": "/s/t.table"}  # a 1.3 daemon
    with pytest.raises(ProtocolError, match="replica list is malformed"):
        pick_replica([{"node": "1", "path": "/x"}], "/s/t.table", 1)


def test_a_cpu_rank_takes_the_node_of_most_of_its_cpus(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    sysfs = fake_sysfs(tmp_path, {0: "4000-4001", 1: ",".join(map(str, allowed))}, {})
    assert rank_node(torch.device("cpu"), sysfs) == 1


@pytest.fixture
def shm_file(shm_dir):
    path = os.path.join(shm_dir, "replica")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    yield path, fd
    os.close(fd)


def test_mbind_before_first_touch_puts_every_page_on_the_node(shm_file):
    """Real mbind/get_mempolicy on a real /dev/shm mapping, node 0 (this machine's only one)."""
    path, fd = shm_file
    nbytes = 4 << 20
    os.ftruncate(fd, nbytes)
    bound = BoundMapping(fd, nbytes, 0, f"replica for NUMA node 0 ({path})")
    try:
        os.posix_fallocate(fd, 0, nbytes)  # pages made after the binding, as the daemon makes them
        os.pwrite(fd, b"\x5a" * nbytes, 0)
        nodes = [bound.node_of(offset) for offset in range(0, nbytes, PAGE)]
        assert len(nodes) == nbytes // PAGE and set(nodes) == {0}
        assert bound.off_node(samples=64) == []
        check_placement(bound, 0, path)
    finally:
        bound.close()


def test_a_page_off_its_node_is_an_error_naming_the_replica(shm_file):
    """The expectation is faked (the mapping claims node 1, which this machine lacks): every page
    is on node 0, so each sampled page is reported, and the error names the replica's node and path."""
    path, fd = shm_file
    os.ftruncate(fd, 1 << 20)
    os.posix_fallocate(fd, 0, 1 << 20)
    bound = BoundMapping(fd, 1 << 20, 0, path)
    try:
        bound.node = 1
        assert len(bound.off_node(samples=16)) == 16
        with pytest.raises(TableFileError, match=f"replica for NUMA node 1 \\({path}\\): 256 of 256 sampled pages "
                                                 "are not on node 1, the first at offset 0 on node 0"):
            check_placement(bound, 1, path)
    finally:
        bound.close()


def test_binding_to_a_node_the_kernel_lacks_fails_naming_the_replica(shm_file):
    path, fd = shm_file
    os.ftruncate(fd, 1 << 20)
    missing = max(present_nodes() or [0]) + 1
    with pytest.raises(TableFileError, match=f"replica for NUMA node {missing} .*mbind\\(MPOL_BIND, node {missing}\\)"):
        BoundMapping(fd, 1 << 20, missing, f"replica for NUMA node {missing} ({path})")
