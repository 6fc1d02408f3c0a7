"""The host path's two signallings on a real stream: stream memory operations and the forced fallback.

Each is checked eagerly and under CUDA graph replay (ids on the host and on the GPU, int32 and
int64, an out-of-range id), against the demo table's definition; graph replays after close must
neither hang nor read the table; ranks in several processes replay their graphs at once.  Waits
on the GPU go through ``finished``, bounded, so a signal nobody answers fails the test instead of
hanging it."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from engram_client import EngramClient, IdsOutOfRangeError
from engram_client.lookup.host import host_signal
from engram_client.core.demo_rows import demo_rows
from exactness import assert_bf16_exact

pytestmark = pytest.mark.gpu
SIGNALLINGS = [host_signal.STREAM_MEMOPS, host_signal.HOST_FUNCTIONS]


@pytest.fixture(params=SIGNALLINGS)
def signalling(request, monkeypatch) -> str:
    monkeypatch.setenv(host_signal.ENV, request.param)
    return request.param


def finished(timeout: float = 30.0) -> None:
    """Wait for the current stream, bounded: an unanswered signal would otherwise hang forever."""
    event = torch.cuda.Event()
    event.record()
    deadline = time.monotonic() + timeout
    while not event.query():
        if time.monotonic() > deadline:
            raise AssertionError(f"the GPU did not finish within {timeout} s: a lookup's signal went unanswered")
        time.sleep(0.001)


def test_lookup_path_info_names_the_signalling_and_every_slot_follows_it(demo_daemon, signalling):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path="host") as client:
        info = client.lookup_path_info
        assert info["signalling"] == signalling and info["reason"], info
        assert info["gather_threads"] == client.lookup_config.gather_threads
        table = client.table(1)
        table.lookup(torch.arange(100))
        assert table._host.signalled == (signalling == host_signal.STREAM_MEMOPS)
        assert all(slot.job.signalled == table._host.signalled for slot in table._host._slots)
        if signalling == host_signal.STREAM_MEMOPS:
            support = info["device_support"]
            assert support["supported"] and support["round_trip_us"] > 0 and support["driver_version"] >= 11070
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path="uva") as uva:
        assert uva.lookup_path_info["signalling"] is None


def test_the_fallback_is_said_once_in_the_log(demo_daemon, monkeypatch, caplog):
    monkeypatch.setenv(host_signal.ENV, host_signal.HOST_FUNCTIONS)
    monkeypatch.setattr(host_signal, "_chosen", {})
    with caplog.at_level(logging.INFO, logger="engram_client"):
        for _ in range(2):
            with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0") as client:
                assert client.lookup_path_info["signalling"] == host_signal.HOST_FUNCTIONS
    said = [r for r in caplog.records if "host functions signal the gather workers" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    monkeypatch.setenv(host_signal.ENV, "sometimes")
    with pytest.raises(Exception, match="ENGRAM_HOST_SIGNAL='sometimes'"):
        EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0")


@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("ids_on", ["cpu", "cuda"])
def test_each_signalling_is_exact_eagerly_and_under_graph_replay(demo_daemon, signalling, ids_on, id_dtype):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path="host") as client:
        table = client.table(14)
        rng = np.random.default_rng(11)
        for n in (1, 33, 3073, 6144, 49152):  # one block, one chunk, chunks of a decode call, prefill-ish
            ids = rng.integers(0, table.num_rows, n)
            assert_bf16_exact(table.lookup(torch.from_numpy(ids).to(id_dtype).to(ids_on)), *demo_rows(0, 14, ids, 256))
        static_ids = torch.zeros(6144, dtype=id_dtype, device=ids_on)
        if ids_on == "cpu":
            static_ids = static_ids.pin_memory()
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
            static_out = table.prefetch(static_ids).wait() * 1
        for replay in range(8):
            ids = rng.integers(0, table.num_rows, static_ids.numel())
            static_ids.copy_(torch.from_numpy(ids).to(id_dtype))
            finished()
            graph.replay()
            finished()
            assert_bf16_exact(static_out, *demo_rows(0, 14, ids, 256))
        ids[7] = table.num_rows
        static_ids.copy_(torch.from_numpy(ids).to(id_dtype))
        finished()
        graph.replay()
        finished()
        assert not static_out[7].any()
        with pytest.raises(IdsOutOfRangeError, match="1 ids in finished lookups"):
            table.prefetch(torch.arange(4))
    graph.replay()  # after close: answered (by the orphans' thread under stream signals), rows zeroed
    finished()
    assert not static_out.any()


def test_back_to_back_replays_of_two_layers_never_mix_their_rows(demo_daemon):
    """Two lookups armed together per replay, 20 replays queued with no host sync between them
    (new ids copied in and results copied out on the stream): the hand-over from one replay's run
    to the next must not lose, merge or reorder a signal."""
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path="host") as client:
        tables = [client.table(layer) for layer in client.layers]
        rows = min(t.num_rows for t in tables)
        static_ids = torch.zeros(6144, dtype=torch.int64, device="cuda")
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
            static_outs = [t.prefetch(static_ids).wait() * 1 for t in tables]
        rng = np.random.default_rng(12)
        all_ids = rng.integers(0, rows, (20, 6144))
        ids_on_gpu = torch.from_numpy(all_ids).cuda()
        results = torch.empty((20, len(tables), 6144, 256), dtype=torch.bfloat16, device="cuda")
        finished()
        for replay in range(20):
            static_ids.copy_(ids_on_gpu[replay])
            graph.replay()
            for i, out in enumerate(static_outs):
                results[replay, i].copy_(out)
        finished()
        for replay in range(20):
            for i, table in enumerate(tables):
                assert_bf16_exact(results[replay, i], *demo_rows(0, table.layer, all_ids[replay], 256))


RANK = textwrap.dedent("""
    import sys, numpy as np, torch
    sys.path.insert(0, sys.argv[3])
    from engram_client import EngramClient
    from engram_client.core.demo_rows import demo_rows
    from exactness import assert_bf16_exact
    client = EngramClient(endpoint=sys.argv[1], device="cuda:0", rank=int(sys.argv[2]), lookup_path="host",
                          gather_threads=3)
    assert client.lookup_path_info["signalling"] == "stream-memops", client.lookup_path_info
    table = client.table(1)
    static = torch.zeros(4096, dtype=torch.int32, device="cuda")
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        out = table.prefetch(static).wait() * 1
    rng = np.random.default_rng(int(sys.argv[2]))
    for replay in range(30):
        ids = rng.integers(0, table.num_rows, static.numel())
        static.copy_(torch.from_numpy(ids).to(torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        assert_bf16_exact(out, *demo_rows(0, 1, ids, 256))
    client.close()
    print("exact", flush=True)
""")


def test_ranks_in_several_processes_replay_their_graphs_at_once(demo_daemon):
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
    procs = [subprocess.Popen([sys.executable, "-c", RANK, demo_daemon.endpoint, str(rank), here],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(3)]
    outputs = [proc.communicate(timeout=240) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), outputs
    assert all(out.strip() == "exact" for out, _ in outputs), outputs
