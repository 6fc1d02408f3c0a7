"""The metrics thread reads the status snapshot the server thread built, never the live lease registry."""
from __future__ import annotations

import os
import time

import pytest

from engram_client.core.protocol import LOADING, READY
from engramd.daemon.config import ServeConfig
from engramd.daemon.state_machine import Daemon
from engramd.reporting.metrics import DaemonCollector
from engramd.daemon.ops import OPERATIONS


def clients_gauge(collector: DaemonCollector) -> float:
    family = next(f for f in collector.collect() if f.name == "engramd_clients")
    return family.samples[0].value


@pytest.fixture
def ready_daemon(tmp_path):
    daemon = Daemon(ServeConfig(shm_dir=str(tmp_path), endpoint="ipc:///tmp/x-snapshot.sock", demo_vocab_size=50))
    try:
        daemon.start_load()
        deadline = time.monotonic() + 30
        while daemon.state == LOADING and time.monotonic() < deadline:
            time.sleep(0.01)
        assert daemon.state == READY, f"demo load did not finish: {daemon.error}"
        yield daemon
    finally:
        daemon.shutdown()


def test_metrics_see_leases_only_once_the_server_thread_rebuilt_the_snapshot(ready_daemon):
    collector = DaemonCollector(ready_daemon)
    ready_daemon.housekeeping()
    assert clients_gauge(collector) == 0
    OPERATIONS["attach"].execute(ready_daemon, {"pid": os.getpid(), "rank": 0, "device": "cpu"})
    assert clients_gauge(collector) == 0, "the collector walked the live lease registry"
    ready_daemon.housekeeping()  # the server loop's turn: the snapshot is rebuilt
    assert clients_gauge(collector) == 1
    assert ready_daemon.snapshot()["state"] == READY and len(ready_daemon.snapshot()["clients"]) == 1


def test_a_snapshot_exists_before_the_first_poll(tmp_path):
    daemon = Daemon(ServeConfig(shm_dir=str(tmp_path), endpoint="ipc:///tmp/x-snapshot2.sock"))
    try:
        assert daemon.snapshot()["state"] == LOADING and daemon.snapshot()["clients"] == []
    finally:
        daemon.close()
