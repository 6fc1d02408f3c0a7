"""The host-gather path on CUDA: exactness, CUDA graphs, out-of-range ids, slots, several clients.

Both paths are checked against the independent numpy reference; graph tests capture a
prefetch, then replay it with new ids written into the same input buffer."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from engram_client import EngramClient, IdsOutOfRangeError, NotAttachedError
from engram_client.core.demo_rows import demo_rows
from engram_client.lookup.host.host_lookup import MAX_SLOTS
from exactness import assert_bf16_exact, assert_float32_exact
from graph_replay import replay_with

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("path", ["host", "uva"])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("ids_on", ["cpu", "cuda"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_both_paths_are_exact_on_every_special_value(special_daemon, path, id_dtype, ids_on, out_dtype):
    daemon, weight, scale = special_daemon
    with EngramClient(endpoint=daemon.endpoint, device="cuda:0", lookup_path=path, out_dtype=out_dtype) as client:
        table = client.table(3)
        rng = np.random.default_rng(1)
        ids = np.concatenate([np.arange(table.num_rows), rng.integers(0, table.num_rows, 5000)])
        out = table.lookup(torch.from_numpy(ids).to(id_dtype).to(ids_on))
        assert out.dtype == out_dtype and out.shape == (ids.size, 256)
        (assert_bf16_exact if out_dtype == torch.bfloat16 else assert_float32_exact)(out, weight[ids], scale[ids])


@pytest.mark.parametrize("threads", [1, 3, 8])
def test_host_path_is_exact_from_one_row_to_many_chunks(demo_daemon, threads):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path="host",
                      gather_threads=threads) as client:
        table = client.table(14)
        rng = np.random.default_rng(threads)
        for n in (1, 33, 6144, 49152, 120000):  # 120,000 rows are 30 MiB: seven pipelined chunks
            ids = rng.integers(0, table.num_rows, n)
            ids_on = "cuda" if n % 2 else "cpu"
            assert_bf16_exact(table.lookup(torch.from_numpy(ids).to(ids_on)), *demo_rows(0, 14, ids, 256))


def test_many_prefetches_in_flight_reuse_a_bounded_ring_of_slots(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path="host") as client:
        table = client.table(1)
        rng = np.random.default_rng(2)
        torch.cuda._sleep(200_000_000)  # hold the stream so that calls pile up behind it
        calls = [rng.integers(0, table.num_rows, 3000) for _ in range(3 * MAX_SLOTS)]
        handles = [table.prefetch(torch.from_numpy(ids)) for ids in calls]  # more than the ring: some wait
        assert len(table._host._slots) == MAX_SLOTS
        for ids, handle in zip(calls, handles):
            assert_bf16_exact(handle.wait(), *demo_rows(0, 1, ids, 256))


@pytest.mark.parametrize("ids_on", ["cuda", "cpu"])
def test_a_captured_prefetch_replays_with_new_ids_in_the_same_buffer(demo_daemon, ids_on):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0") as client:
        table = client.table(14)
        rng = np.random.default_rng(3)
        static_ids = torch.zeros(6144, dtype=torch.int64, device=ids_on)
        if ids_on == "cpu":
            static_ids = static_ids.pin_memory()
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            with torch.cuda.graph(graph, stream=side):
                static_out = table.prefetch(static_ids).wait() * 1  # the model consumes it in the graph
        for replay in range(5):
            ids = rng.integers(0, table.num_rows, static_ids.numel())
            replay_with(graph, static_ids, ids)
            assert_bf16_exact(static_out, *demo_rows(0, 14, ids, 256))
        # A replay with a bad id zeroes its row and the next eager call reports it.
        ids[5] = -3
        replay_with(graph, static_ids, ids)
        assert not static_out[5].any()
        with pytest.raises(IdsOutOfRangeError, match="1 ids in finished lookups"):
            table.prefetch(torch.arange(4))
    # After close a replay must not read the unmapped table: its rows come back zeros.
    graph.replay()
    torch.cuda.synchronize()
    assert not static_out.any()


@pytest.mark.parametrize("path", ["host", "uva"])
def test_gpu_ids_out_of_range_are_reported_after_their_lookup_without_a_host_sync(demo_daemon, path):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path=path) as client, \
            EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path=path, strict_ids=True) as strict:
        table = client.table(1)
        bad = torch.tensor([0, -5, table.num_rows, 2**40, 7, -5], device="cuda")
        # Warm: the kernel a UVA client launches for ids like these on the GPU compiled (lookup_kernel.py's
        # ARMED; Triton specializes on their dtype and count), so that no compile outlasts the sleep below.
        table.lookup(torch.zeros_like(bad))
        torch.cuda._sleep(500_000_000)  # the lookup cannot finish before prefetch() and wait() return
        handle = table.prefetch(bad)
        out = handle.wait()  # nothing finished yet: nothing to report, and no host sync
        assert not handle.done()
        torch.cuda.synchronize()
        assert not out[[1, 2, 3, 5]].any() and out[[0, 4]].any()
        with pytest.raises(IdsOutOfRangeError, match="4 ids in finished lookups were outside layer 1's rows"):
            table.prefetch(torch.tensor([1], device="cuda"))
        table.prefetch(torch.tensor([1], device="cuda")).wait()  # reported once
        with pytest.raises(IdsOutOfRangeError, match="4 ids"):
            strict.table(1).lookup(bad)  # strict: waits and raises at this lookup's own wait


def test_several_clients_in_one_process_share_nothing_but_the_table(demo_daemon):
    clients = [EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path=path, gather_threads=t)
               for path, t in (("host", 2), ("host", 4), ("uva", 1))]
    try:
        rng = np.random.default_rng(5)
        handles = []
        for step in range(4):
            for client in clients:
                ids = rng.integers(0, client.table(1).num_rows, 6144)
                handles.append((ids, client.table(1).prefetch(torch.from_numpy(ids).cuda())))
        for ids, handle in handles:
            assert_bf16_exact(handle.wait(), *demo_rows(0, 1, ids, 256))
        table = clients[0].table(1)
        clients[0].close()
        with pytest.raises(NotAttachedError):
            table.lookup(torch.arange(3))
        ids = np.arange(50)
        assert_bf16_exact(clients[1].table(1).lookup(torch.from_numpy(ids)), *demo_rows(0, 1, ids, 256))
    finally:
        for client in clients:
            client.close()


def test_threads_prefetching_on_one_table_never_share_a_staging_slot(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path="host") as client:
        table = client.table(14)
        failures: list[BaseException] = []

        def caller(seed: int) -> None:
            try:
                rng = np.random.default_rng(seed)
                for _ in range(20):
                    ids = rng.integers(0, table.num_rows, 4096)
                    out = table.prefetch(torch.from_numpy(ids).cuda()).wait()
                    torch.cuda.current_stream().synchronize()
                    assert_bf16_exact(out, *demo_rows(0, 14, ids, 256))
            except BaseException as exc:  # reported by the main thread
                failures.append(exc)

        threads = [threading.Thread(target=caller, args=(seed,)) for seed in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not failures, failures

