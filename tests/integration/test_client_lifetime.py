"""A client's lease over its life: garbage collection, idling, and a daemon restart under it."""
from __future__ import annotations

import gc
import logging
import time

import numpy as np
import pytest
import torch

from engram_client import EngramClient, NotAttachedError
from engram_client.attach.mapped_generation import MappedGeneration
from engram_client.core.demo_rows import demo_rows
from exactness import assert_bf16_exact
from waiting import wait_for


def check_rows(client: EngramClient, layer: int = 1, seed: int = 0) -> None:
    table = client.table(layer)
    ids = np.random.default_rng(layer).integers(0, table.num_rows, 500)
    ids[:2] = 0, table.num_rows - 1
    assert_bf16_exact(table.lookup(torch.from_numpy(ids)), *demo_rows(seed, layer, ids, 256))


def test_dropped_client_detaches(daemon_factory):
    # The default 10 s lease cannot expire within this test: an empty client list means a detach.
    daemon = daemon_factory()
    daemon.wait_state("ready")
    client = EngramClient(endpoint=daemon.endpoint, device="cpu", timeout=30)
    client_id = client.client_id
    assert [c["id"] for c in daemon.status()["clients"]] == [client_id]
    del client
    gc.collect()
    wait_for(lambda: daemon.status()["clients"] == [], "the dropped client's lease was not released", 5.0)
    wait_for(lambda: f"client {client_id} detached" in daemon.log(), "the daemon never logged the detach", 5.0)
    assert "expired" not in daemon.log()


def test_idle_client_keeps_its_lease(daemon_factory):
    daemon = daemon_factory("--lease-seconds", "1")
    daemon.wait_state("ready")
    with EngramClient(endpoint=daemon.endpoint, device="cpu", timeout=30) as client:
        client_id = client.client_id
        time.sleep(3.0)  # three leases without a request from the caller: only the heartbeat thread speaks
        clients = daemon.status()["clients"]
        assert [c["id"] for c in clients] == [client_id], "the lease was lost (or re-granted) while idle"
        assert client.attached and client.client_id == client_id
        assert "expired" not in daemon.log()
        check_rows(client)
    assert daemon.status()["clients"] == []


def test_the_lease_is_kept_while_attaching_takes_longer_than_the_lease(daemon_factory, monkeypatch):
    # Registering a table with CUDA costs about 0.06 s per GiB, so a 188.8 GiB table attaches in
    # longer than the default 10 s lease.  There is no CUDA here: the real mapping is delayed by
    # three leases instead (a sleep standing in for the registration), and the lease must survive.
    daemon = daemon_factory("--lease-seconds", "1")
    daemon.wait_state("ready")
    granted, real_open = [], MappedGeneration.open

    def slow_open(reply, *args, **kwargs):
        granted.append(reply["client_id"])
        time.sleep(3.0)
        return real_open(reply, *args, **kwargs)
    monkeypatch.setattr(MappedGeneration, "open", staticmethod(slow_open))
    with EngramClient(endpoint=daemon.endpoint, device="cpu", timeout=30) as client:
        time.sleep(1.5)  # the heartbeat thread's first beats: a lost lease would be re-attached under a new id
        assert [c["id"] for c in daemon.status()["clients"]] == granted == [client.client_id]
        assert "expired" not in daemon.log()
        check_rows(client)
    assert daemon.status()["clients"] == []


def test_client_reattaches_to_a_restarted_daemon(daemon_factory, caplog):
    first = daemon_factory("--lease-seconds", "1.5")
    old_status = first.wait_state("ready")
    client = EngramClient(endpoint=first.endpoint, device="cpu", timeout=30)
    try:
        assert client.boot_id == old_status["boot_id"]
        table_path = client.table_path
        check_rows(client)

        first.connection.request("stop")
        assert first.proc.wait(timeout=30) == 0
        second = daemon_factory("--lease-seconds", "1.5")  # same socket, same shm dir
        assert second.endpoint == first.endpoint
        new_status = second.wait_state("ready")
        assert new_status["boot_id"] != old_status["boot_id"]

        # The daemon lists the lease before its reply reaches the client's heartbeat thread, so wait
        # for the client's side (the boot id, set after the lease id) before comparing the two.
        wait_for(lambda: client.boot_id == new_status["boot_id"], "the client did not re-attach to the restarted daemon", 5.0)
        assert [c["id"] for c in second.status()["clients"]] == [client.client_id]
        assert client.attached

        # The client still maps the first daemon's table, unlinked when it stopped (the new
        # daemon's file may have the same name, but it is another file); its pages stay valid.
        with open("/proc/self/maps") as maps:
            mapped = [line.rstrip("\n") for line in maps if table_path in line]
        assert mapped and all(line.endswith("(deleted)") for line in mapped), mapped
        check_rows(client, layer=1)
        check_rows(client, layer=14)
        # Both daemons call their table generation 1: the move says it went to the restarted one's,
        # not "from generation 1 to 1".
        with caplog.at_level(logging.INFO, logger="engram_client"):
            assert client.refresh()
        moved = [r.getMessage() for r in caplog.records if "moved" in r.getMessage()]
        assert moved == [f"moved to the restarted daemon's generation 1 ({client.table_path}), from its "
                         f"predecessor's ({table_path})"], moved
        check_rows(client, layer=1)
    finally:
        client.close()
    assert second.status()["clients"] == []


def test_a_table_keeps_its_client_alive(daemon_factory):
    # The one-line use: nothing but the table (then the prefetch handle) refers to the client.
    daemon = daemon_factory()
    daemon.wait_state("ready")
    ids = torch.arange(0, 500, dtype=torch.int64)
    out = EngramClient(endpoint=daemon.endpoint, device="cpu", timeout=30).table(1).lookup(ids)
    assert_bf16_exact(out, *demo_rows(0, 1, ids.numpy(), 256))
    out = EngramClient(endpoint=daemon.endpoint, device="cpu", timeout=30).table(14).prefetch(ids).wait()
    assert_bf16_exact(out, *demo_rows(0, 14, ids.numpy(), 256))
    table = EngramClient(endpoint=daemon.endpoint, device="cpu", timeout=30).table(1)
    gc.collect()
    assert len(daemon.status()["clients"]) == 1, "the client of a table still held was released"
    assert_bf16_exact(table.lookup(ids), *demo_rows(0, 1, ids.numpy(), 256))
    # The last reference gone: the lease is released at once (no reference cycle to wait for).
    del table
    wait_for(lambda: daemon.status()["clients"] == [], "dropping the last table did not release its client", 5.0)


def test_close_ends_the_client_and_its_tables(daemon_factory):
    daemon = daemon_factory()
    daemon.wait_state("ready")
    client = EngramClient(endpoint=daemon.endpoint, device="cpu", timeout=30)
    table = client.table(1)
    assert client.table(1) is table and table.num_rows == client.table(1).num_rows
    client.close()
    assert daemon.status()["clients"] == []
    with pytest.raises(NotAttachedError, match="is closed"):
        table.lookup(torch.arange(10))
    with pytest.raises(NotAttachedError, match="is closed"):
        client.table(1)


def test_a_failed_daemon_is_logged_once_while_it_lasts_and_its_end_too(daemon_factory, tmp_path, caplog,
                                                                       monkeypatch):
    caplog.set_level(logging.INFO, logger="engram_client")
    first = daemon_factory("--lease-seconds", "1.5")  # heartbeats every 0.5 s
    first.wait_state("ready")
    client = EngramClient(endpoint=first.endpoint, device="cpu", timeout=30)
    connection, attaches = client._state.connection, []
    real_request = connection.request

    def counting_request(op, args=None, timeout=5.0):  # the real request, counted
        if op == "attach":
            attaches.append(op)
        return real_request(op, args, timeout)

    monkeypatch.setattr(connection, "request", counting_request)
    try:
        first.connection.request("stop")
        assert first.proc.wait(timeout=30) == 0
        (tmp_path / "empty").mkdir()
        broken = daemon_factory("--lease-seconds", "1.5", "--checkpoint", str(tmp_path / "empty"))
        broken.wait_state("failed")
        wait_for(lambda: len(attaches) >= 4, "four re-attach attempts to the failed daemon", 30.0)
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("could not re-attach")]
        # Once for the failure, however many attempts met it (a heartbeat may first have met the
        # daemon still loading: that state is said once too).
        failed = [text for text in said if "config.json not found" in text and "state is loading" not in text]
        assert len(failed) == 1 and len(said) == len(set(said)) <= 2, said
        broken.connection.request("stop")
        assert broken.proc.wait(timeout=30) == 0
        good = daemon_factory("--lease-seconds", "1.5")
        good.wait_state("ready")
        back = wait_for(lambda: [r.getMessage() for r in caplog.records if "re-attached" in r.getMessage()],
                        "the client to re-attach to the good daemon", 30.0)
        # The last problem may be the failed daemon's, the gap with no socket, or the new one loading.
        assert "failed attempts; the last: " in back[0], back
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("could not re-attach")]
        # Each state once while it lasts: failed, then the good daemon loading (the broken one may have
        # been met loading first, so "loading" may come twice, never twice in a row).
        assert all(this != after for this, after in zip(said, said[1:])), said
        assert sum("config.json not found" in text for text in said) == 1, said
    finally:
        client.close()
