"""The C gather behind device="cpu" lookups, through a real daemon: several clients in one
process, concurrent callers, every lookup option validated where the client is built."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from engram_client import EngramClient, IdsOutOfRangeError, NotAttachedError
from engram_client.demo_rows import demo_rows
from engram_client.lookup_config import LookupConfig, default_gather_threads
from exactness import assert_bf16_exact


def test_several_clients_in_one_process_gather_concurrently_and_exactly(demo_daemon):
    clients = [EngramClient(endpoint=demo_daemon.endpoint, device="cpu", gather_threads=threads)
               for threads in (1, 2, 4)]
    try:
        assert [c.lookup_config.gather_threads for c in clients] == [1, 2, 4]
        assert len({id(c._state.pool) for c in clients}) == 3, "each client owns its pool"
        failures: list[BaseException] = []

        def rank(client: EngramClient, seed: int) -> None:
            try:
                rng = np.random.default_rng(seed)
                for step in range(6):
                    layer = client.layers[step % 2]
                    ids = rng.integers(0, client.table(layer).num_rows, (16, 24))
                    out = client.table(layer).lookup(torch.from_numpy(ids).to(torch.int32 if step % 3 else torch.int64))
                    assert_bf16_exact(out, *demo_rows(0, layer, ids.reshape(-1), 256))
            except BaseException as exc:  # reported by the main thread
                failures.append(exc)

        threads = [threading.Thread(target=rank, args=(c, i)) for i, c in enumerate(clients * 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not failures, failures
        assert all(c._state.pool.jobs_run >= 12 for c in clients)

        # One client closing leaves the others serving; its own tables refuse clearly.
        closed_table = clients[0].table(1)
        clients[0].close()
        assert clients[0]._state.pool.closed
        with pytest.raises(NotAttachedError):
            closed_table.lookup(torch.arange(4))
        ids = np.arange(100)
        assert_bf16_exact(clients[1].table(1).lookup(torch.from_numpy(ids)), *demo_rows(0, 1, ids, 256))
    finally:
        for c in clients:
            c.close()


def test_host_ids_out_of_range_raise_at_once_and_nothing_is_gathered(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cpu", gather_threads=2) as client:
        table = client.table(14)
        runs = client._state.pool.jobs_run
        with pytest.raises(IdsOutOfRangeError, match=r"2 of 5 ids are outside layer 14's rows"):
            table.prefetch(torch.tensor([0, -1, 5, table.num_rows, 9]))
        assert client._state.pool.jobs_run == runs
        ids = np.array([0, table.num_rows - 1])
        assert_bf16_exact(table.lookup(torch.from_numpy(ids)), *demo_rows(0, 14, ids, 256))


@pytest.mark.parametrize("options, message", [
    ({"lookup_path": "gpu"}, "lookup_path must be one of auto, host, uva"),
    ({"gather_threads": 0}, "gather_threads must be an int from 1 to 1024"),
    ({"lookup_timeout": 0}, "lookup_timeout must be positive"),
    ({"out_dtype": torch.float16}, "out_dtype must be torch.bfloat16 or torch.float32"),
    ({"lookup_strategy": "sorted"}, "lookup strategy must be one of"),
])
def test_bad_lookup_options_are_refused_before_attaching(demo_daemon, options, message):
    with pytest.raises(ValueError, match=message):
        EngramClient(endpoint=demo_daemon.endpoint, device="cpu", **options)
    assert demo_daemon.status()["clients"] == [], "a refused client must not hold a lease"


def test_lookup_config_defaults_and_the_auto_rule():
    assert 1 <= default_gather_threads() <= 16
    config = LookupConfig(gather_threads=8)
    assert [config.choose_path(n) for n in (6144, 49152, 393216)] == ["host"] * 3
    one = LookupConfig(gather_threads=1)
    assert one.choose_path(2000) == "host" and one.choose_path(393216) == "uva"
    assert LookupConfig(path="uva").choose_path(10) == "uva"
    assert LookupConfig(hot_cache_bytes=1 << 20).choose_path(10) == "uva"
    with pytest.raises(ValueError, match="hot-row cache serves the UVA kernel"):
        LookupConfig(path="host", hot_cache_bytes=1 << 20)
    with pytest.raises(Exception):
        config.path = "uva"  # frozen: one config, shared by every table of a client
