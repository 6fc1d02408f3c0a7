"""kill -9 under attached ranks: they keep serving; the next daemon re-adopts the table and
the ranks re-attach to it by themselves."""
from __future__ import annotations

import signal
import time

import numpy as np
import torch

from engram_client import EngramClient
from engram_client.core.demo_rows import demo_rows
from exactness import assert_bf16_exact
from waiting import wait_for


def test_ranks_survive_kill_9_and_reattach_to_the_readopted_table(daemon_factory):
    first = daemon_factory("--lease-seconds", "0.9")
    before = first.wait_state("ready")
    clients = [EngramClient(endpoint=first.endpoint, device="cpu", rank=r) for r in range(3)]
    try:
        first.kill(signal.SIGKILL)
        ids = np.arange(0, 5000, 3)
        for client in clients:  # no daemon at all: lookups go on from the mappings
            assert_bf16_exact(client.table(1).lookup(torch.from_numpy(ids)), *demo_rows(0, 1, ids, 256))
        started = time.monotonic()
        second = daemon_factory("--lease-seconds", "0.9")
        after = second.wait_state("ready")
        print(f"re-adopted and ready {time.monotonic() - started:.2f} s after the process started")
        assert after["adopted"] and after["boot_id"] != before["boot_id"]
        assert after["table_path"] == before["table_path"]
        # The daemon lists a lease before its reply reaches the rank's heartbeat thread: wait for the
        # ranks' side (the boot id, which a re-attach sets last) before comparing.
        wait_for(lambda: all(client.boot_id == after["boot_id"] for client in clients),
                 "the three ranks to re-attach to the re-adopting daemon", 15.0)
        listed = second.status()["clients"]
        assert sorted(c["rank"] for c in listed) == [0, 1, 2], listed
        for client in clients:
            assert not client.refresh_pending, "the re-adopted file is the one the client maps"
            assert_bf16_exact(client.table(14).lookup(torch.from_numpy(ids)), *demo_rows(0, 14, ids, 256))
    finally:
        for client in clients:
            client.close()


def test_restart_onto_a_different_table_flags_a_refresh(daemon_factory):
    first = daemon_factory("--lease-seconds", "0.9", "--demo-seed", "1")
    first.wait_state("ready")
    client = EngramClient(endpoint=first.endpoint, device="cpu")
    try:
        first.kill(signal.SIGKILL)
        second = daemon_factory("--lease-seconds", "0.9", "--demo-seed", "2")
        second.wait_state("ready")
        deadline = time.monotonic() + 15
        while not client.refresh_pending and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.refresh_pending, "a client mapping a table the daemon no longer serves must know"
        ids = np.arange(40)
        assert_bf16_exact(client.table(1).lookup(torch.from_numpy(ids)), *demo_rows(1, 1, ids, 256))
        assert client.refresh() is True
        assert_bf16_exact(client.table(1).lookup(torch.from_numpy(ids)), *demo_rows(2, 1, ids, 256))
    finally:
        client.close()
