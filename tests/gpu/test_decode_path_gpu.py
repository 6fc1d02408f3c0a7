"""decode_path="uva": decode-size calls on the UVA kernel, eager and captured in CUDA graphs.

What a decoding rank beside prefilling ranks asks for (docs/integration.md, "Decode lookups on the
GPU"): its decode-size calls take no CPU, and every larger call still takes the host path.  The
gather pool's row count says which path served a call (the kernel reads no row through it)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engram_client import EngramClient, IdsOutOfRangeError, NotCapturableError
from engram_client.core.demo_rows import demo_rows
from engram_client.lookup.config import DECODE_ROWS
from exactness import assert_bf16_exact
from graph_replay import replay_with

pytestmark = pytest.mark.gpu


def rows_gathered(client) -> int:
    return client._state.pool.cache_counts[2]  # rows the host path's pool read from the table


def capture(table, static_ids):
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph, stream=side):
            static_out = table.prefetch(static_ids).wait() * 1  # the model consumes it in the graph
    return graph, static_out


@pytest.mark.parametrize("ids_on", ["cuda", "cpu"])
def test_a_captured_decode_call_replays_exactly_on_the_kernel_and_reads_nothing_after_close(demo_daemon, ids_on):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path="host",
                      decode_path="uva") as client:
        table = client.table(14)
        rng = np.random.default_rng(5)
        static_ids = torch.zeros(6144, dtype=torch.int64, device=ids_on)
        if ids_on == "cpu":
            static_ids = static_ids.pin_memory()
        gathered = rows_gathered(client)
        graph, static_out = capture(table, static_ids)
        for _ in range(4):
            ids = rng.integers(0, table.num_rows, static_ids.numel())
            replay_with(graph, static_ids, ids)
            assert_bf16_exact(static_out, *demo_rows(0, 14, ids, 256))
        assert rows_gathered(client) == gathered  # no row went through the CPUs
        # A replay with bad ids zeroes their rows, and the next call reports them, once.
        ids[[5, 9]] = [-3, table.num_rows]
        replay_with(graph, static_ids, ids)
        assert not static_out[5].any() and not static_out[9].any() and static_out[6].any()
        with pytest.raises(IdsOutOfRangeError, match="2 ids in finished lookups were outside layer 14's rows"):
            table.prefetch(torch.arange(4))
        table.prefetch(torch.arange(4)).wait()
    # After close a replay must not read the unmapped table: its rows come back zeros, nothing faults.
    static_out.fill_(1)
    graph.replay()
    torch.cuda.synchronize()
    assert not static_out.any()


def test_eager_calls_take_the_kernel_up_to_decode_size_and_the_host_path_above(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path="host",
                      decode_path="uva") as client:
        table = client.table(1)
        rng = np.random.default_rng(6)
        for n, through_cpus in ((1, False), (DECODE_ROWS, False), (DECODE_ROWS + 1, True)):
            ids = rng.integers(0, table.num_rows, n)
            before = rows_gathered(client)
            out = table.lookup(torch.from_numpy(ids).cuda())
            assert_bf16_exact(out, *demo_rows(0, 1, ids, 256))
            assert (rows_gathered(client) - before == n) == through_cpus, n
        assert client.lookup_path_info["decode_path"] == "uva"


@pytest.mark.parametrize("strict", [False, True])
def test_an_eager_decode_call_with_ids_on_the_gpu_counts_its_bad_ids_in_the_tables_words(demo_daemon, strict):
    """Eager decode-size calls with ids on the GPU launch as a captured one does, on the table's words
    (no count of their own to allocate, copy and watch): their bad ids are reported once, at the
    call's own wait once it has finished (strict mode waits for that), and counted in the words."""
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path="host", decode_path="uva",
                      strict_ids=strict) as client:
        table = client.table(14)
        ids = torch.from_numpy(np.random.default_rng(9).integers(0, table.num_rows, 6144)).cuda()
        ids[[3, 7]] = torch.tensor([-1, table.num_rows + 5], device="cuda")
        handle = table.prefetch(ids)
        if not strict:
            torch.cuda.synchronize()  # finished, so that this wait reports it (else the next call would)
        with pytest.raises(IdsOutOfRangeError, match="^2 ids in finished lookups were outside layer 14's rows"):
            handle.wait()
        assert table.graph_words.bad.item() == 2
        good = np.random.default_rng(10).integers(0, table.num_rows, 6144)
        assert_bf16_exact(table.lookup(torch.from_numpy(good).cuda()), *demo_rows(0, 14, good, 256))


def test_a_captured_prefill_size_call_still_takes_the_host_path(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path="host",
                      decode_path="uva") as client:
        table = client.table(1)
        ids = np.random.default_rng(7).integers(0, table.num_rows, DECODE_ROWS + 1)
        static_ids = torch.from_numpy(ids).cuda()
        graph, static_out = capture(table, static_ids)
        before = rows_gathered(client)
        graph.replay()
        torch.cuda.synchronize()
        assert_bf16_exact(static_out, *demo_rows(0, 1, ids, 256))
        assert rows_gathered(client) - before == ids.size


def test_a_captured_decode_call_refuses_host_ids_that_are_not_pinned(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", decode_path="uva") as client:
        with pytest.raises(NotCapturableError, match="contiguous and in pinned memory"):
            capture(client.table(1), torch.zeros(64, dtype=torch.int64))


def test_a_uva_only_client_captures_decode_size_calls_now(demo_daemon):
    """lookup_path "uva" (no gather pool) used to refuse every capture; its decode-size calls capture
    on the kernel (larger ones are still refused: tests/gpu/test_lookup_gpu.py)."""
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path="uva") as client:
        table = client.table(1)
        ids = np.random.default_rng(8).integers(0, table.num_rows, 512)
        graph, static_out = capture(table, torch.from_numpy(ids).cuda())
        graph.replay()
        torch.cuda.synchronize()
        assert_bf16_exact(static_out, *demo_rows(0, 1, ids, 256))
