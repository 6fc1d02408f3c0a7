"""The C gather behind device="cpu" lookups, through a real daemon: several clients in one
process, concurrent callers, every lookup option validated where the client is built."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from engram_client import EngramClient, IdsOutOfRangeError, NotAttachedError
from engram_client.core.demo_rows import demo_rows
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


def test_non_contiguous_and_int32_ids_gather_the_rows_they_name(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cpu", gather_threads=2) as client:
        table = client.table(1)
        ids = np.random.default_rng(9).integers(0, table.num_rows, (40, 24))
        strided = torch.from_numpy(ids).to(torch.int32)[:, ::3]  # a view: every third head
        assert not strided.is_contiguous()
        out = table.lookup(strided)
        assert out.shape == (40, 8, 256)
        assert_bf16_exact(out, *demo_rows(0, 1, ids[:, ::3].reshape(-1), 256))



def test_lookup_path_info_of_a_cpu_client_names_no_signalling(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cpu", gather_threads=3) as client:
        info = client.lookup_path_info
        assert (info["device"], info["gather_threads"], info["signalling"]) == ("cpu", 3, None)
        assert client._state.pool.caller_gathers, "CPU lookups gather on the calling thread too"
