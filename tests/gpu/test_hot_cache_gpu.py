"""The HBM hot-row cache on the host path (and, where named, the UVA path), on CUDA: exact rows
whatever serves them, hits that really skip the host gather, CUDA graphs, out-of-range ids, the fixed part, disarming.

Rows are checked against the independent numpy reference (demo_rows); hits and fetched rows
are the gather pool's own counts (the C workers count what they skip and what they read)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engram_client import EngramClient, IdsOutOfRangeError
from engram_client.core.demo_rows import demo_rows
from engram_client.lookup.cache.row_cache import HbmRowCache
from exactness import assert_bf16_exact

pytestmark = pytest.mark.gpu
CACHE = 64 << 20


def zipf_ids(rng, n: int, rows: int) -> np.ndarray:
    return (rng.zipf(1.2, n) * 7919) % rows  # repeats spread over the table


def counts(client):
    return client._state.pool.cache_counts


@pytest.mark.parametrize("ids_on", ["cuda", "cpu"])
@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
def test_rows_are_exact_and_repeats_are_served_from_hbm(demo_daemon, ids_on, id_dtype):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", hot_cache_bytes=CACHE) as client:
        table = client.table(14)
        assert table._rows.hbm_cache is not None and table._rows.hbm_cache.fixed_count == 0  # no list served
        rng = np.random.default_rng(0)
        asked, before = 0, counts(client)  # after attach's warm-up lookups
        for n in (1, 6144, 6144, 49152, 6144, 120000):
            ids = zipf_ids(rng, n, table.num_rows)
            asked += n
            out = table.lookup(torch.from_numpy(ids).to(id_dtype).to(ids_on))
            assert_bf16_exact(out, *demo_rows(0, 14, ids, 256))
        hits, misses, fetched = (now - then for now, then in zip(counts(client), before))
        assert hits + misses == asked and hits > asked // 4 and fetched == misses


@pytest.mark.parametrize("path", ["host", "uva"])
def test_a_cached_lookup_matches_the_uncached_one_over_many_calls(demo_daemon, path):
    """Either path with the one cache against the same path without it (the UVA path has no pool:
    no counts, and its host ids take pinned memory to the GPU)."""
    rng = np.random.default_rng(1)
    calls = [zipf_ids(rng, int(rng.integers(1, 20000)), 1 << 20) for _ in range(40)]
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", hot_cache_bytes=1 << 20,
                      lookup_path=path) as cached, \
            EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path=path) as plain:
        a, b = cached.table(1), plain.table(1)
        ids_on = ["cuda", "cpu"]
        handles = [(a.prefetch(torch.from_numpy(ids % a.num_rows).to(ids_on[i % 2])),
                    b.prefetch(torch.from_numpy(ids % a.num_rows).cuda())) for i, ids in enumerate(calls)]  # in flight
        for x, y in handles:
            assert torch.equal(x.wait().view(torch.int16), y.wait().view(torch.int16))
        cache = a._rows.hbm_cache
        assert int(cache.control[0]) >= len(calls) and int((cache.recent_keys >= 0).sum()) > 0
        if path == "host":
            assert counts(cached)[0] > 0  # a small cache, evicting all the while: still exact


def test_the_fixed_part_serves_its_rows_from_the_first_call(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", hot_cache_bytes=CACHE) as client:
        table = client.table(14)
        rows = table._rows
        hot = np.arange(0, table.num_rows - 1, 7, dtype=np.int64)[::-1].copy()  # ranked, most frequent first
        cache = HbmRowCache(CACHE, 256, rows.layout.row_bytes, rows.row_lo, rows.row_hi, client.device, hot)
        cache.load_fixed(client._state.pool, rows.host_rows, rows.row_lo, rows.row_hi, client._state.stream)
        rows._host.cache.disarm(client._state.stream)
        rows.hbm_cache = rows._host.cache = cache
        assert 0 < cache.fixed_count <= hot.size and cache.load_seconds > 0
        before = counts(client)
        n = min(3000, cache.fixed_count)
        ids = np.concatenate([hot[:n], hot[:n] + 1])  # n listed (the top of the list), n not
        assert_bf16_exact(table.lookup(torch.from_numpy(ids).cuda()), *demo_rows(0, 14, ids, 256))
        after = counts(client)
        assert (after[0] - before[0], after[1] - before[1]) == (n, n)


def test_a_captured_cached_prefetch_replays_exactly_and_learns(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", hot_cache_bytes=CACHE) as client:
        table = client.table(14)
        rng = np.random.default_rng(3)
        static_ids = torch.zeros(6144, dtype=torch.int64, device="cuda")
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            with torch.cuda.graph(graph, stream=side):
                static_out = table.prefetch(static_ids).wait() * 1
        hot = zipf_ids(rng, 6144, table.num_rows)
        for replay in range(6):
            ids = hot if replay % 2 else zipf_ids(rng, 6144, table.num_rows)
            static_ids.copy_(torch.from_numpy(ids))
            graph.replay()
            torch.cuda.synchronize()
            assert_bf16_exact(static_out, *demo_rows(0, 14, ids, 256))
        hits, misses, _ = counts(client)
        assert hits > 6144  # the repeated call's ids were cached by its first replay


def test_pinned_host_ids_capture_and_pageable_ones_are_refused(demo_daemon):
    from engram_client import NotCapturableError

    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", hot_cache_bytes=CACHE) as client:
        table = client.table(1)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            with pytest.raises(NotCapturableError, match="pinned memory"):
                with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=side):
                    table.prefetch(torch.zeros(64, dtype=torch.int64))
        static_ids = torch.zeros(64, dtype=torch.int64).pin_memory()
        graph = torch.cuda.CUDAGraph()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            with torch.cuda.graph(graph, stream=side):
                static_out = table.prefetch(static_ids).wait() * 1
        ids = np.arange(64) * 31
        static_ids.copy_(torch.from_numpy(ids))
        graph.replay()
        torch.cuda.synchronize()
        assert_bf16_exact(static_out, *demo_rows(0, 1, ids, 256))


def test_out_of_range_ids_are_zeroed_counted_and_never_cached(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", hot_cache_bytes=CACHE) as client:
        table = client.table(14)
        ids = torch.tensor([5, -1, table.num_rows, 5, -2**62, 7] * 100, device="cuda")
        handle = table.prefetch(ids)
        torch.cuda.synchronize()
        out = handle._out  # wait() reports the bad ids (below); the rows are what the lookup wrote
        valid = ((ids >= 0) & (ids < table.num_rows)).cpu().numpy()
        assert not out[torch.from_numpy(~valid).cuda()].any()
        good = ids.cpu().numpy()[valid]
        assert_bf16_exact(out[torch.from_numpy(valid).cuda()], *demo_rows(0, 14, good, 256))
        with pytest.raises(IdsOutOfRangeError, match="300 ids in finished lookups"):
            handle.wait()
        with pytest.raises(IdsOutOfRangeError):
            table.lookup(torch.tensor([1, -1]))  # host ids: at once, nothing enqueued
        keys = table._rows.hbm_cache.recent_keys
        assert int(((keys < 0) & (keys != -1)).sum()) == 0 and int((keys >= table.num_rows).sum()) == 0


def test_a_graph_replayed_after_close_reads_nothing_and_does_not_crash(demo_daemon):
    client = EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", hot_cache_bytes=CACHE)
    table = client.table(14)
    static_ids = torch.arange(6144, device="cuda")
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph, stream=side):
            static_out = table.prefetch(static_ids).wait() * 1
    graph.replay()
    torch.cuda.synchronize()
    assert static_out.abs().sum() > 0
    client.close()
    graph.replay()
    torch.cuda.synchronize()
    assert not static_out.any()


def test_the_heartbeat_report_sums_the_layers(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", hot_cache_bytes=CACHE) as client:
        before = client._state.cache_report()
        client.table(1).lookup(torch.arange(1000, 2000, device="cuda"))
        client.table(1).lookup(torch.arange(1000, 2000, device="cuda"))
        torch.cuda.synchronize()  # the workers count as they gather; a lookup's return does not wait for them
        report = client._state.cache_report()
        hits, misses = report["hits"] - before["hits"], report["misses"] - before["misses"]
        # The first call misses all 1,000; the second hits each row its first call could insert (one
        # insertion a set a call: rows that shared a set with another miss of that call come again).
        assert hits + misses == 2000 and 1000 <= misses < 1100 and report["fetched"] - before["fetched"] == misses
        assert 0 < report["bytes"] <= CACHE and report["recent_rows"] > 0


def test_a_served_hot_row_list_fills_the_fixed_part_at_attach(daemon_factory, tmp_path):
    """The whole way: `engramd hot-rows build` on a synthetic checkpoint, `serve --hot-rows`, and a
    rank whose cache holds the list's rows from its first lookup (rows checked against a CPU rank)."""
    from click.testing import CliRunner

    from engramd.cli.main import main
    from engramd.loading.hot_rows_build import build_hot_rows

    result = CliRunner().invoke(main, ["synth", str(tmp_path / "a"), "--vocab-size", "300", "--tokenizer-vocab", "400"])
    assert result.exit_code == 0, result.output
    words = [w for w in (tmp_path / "a" / "tokenizer.json").read_text().split('"') if w.isalpha()][:200]
    rng = np.random.default_rng(5)
    (tmp_path / "traffic.txt").write_text("\n".join(" ".join(rng.choice(words, 12)) for _ in range(300)) + "\n")
    build_hot_rows(str(tmp_path / "a"), [str(tmp_path / "traffic.txt")], str(tmp_path / "a.hot"), rows_per_layer=64)
    daemon = daemon_factory("--checkpoint", str(tmp_path / "a"), "--hot-rows", str(tmp_path / "a.hot"))
    daemon.wait_state("ready")
    with EngramClient(endpoint=daemon.endpoint, device="cuda:0", hot_cache_bytes=CACHE) as client, \
            EngramClient(endpoint=daemon.endpoint, device="cpu") as reference:
        layer = client.layers[0]
        listed = client._state.mapped.hot_list.ranked(layer)
        table = client.table(layer)
        assert table._rows.hbm_cache.fixed_count == listed.size == 64
        before = counts(client)
        ids = torch.from_numpy(np.ascontiguousarray(listed[::-1]))
        out = table.lookup(ids.cuda())
        torch.cuda.synchronize()
        assert torch.equal(out.cpu().view(torch.int16), reference.table(layer).lookup(ids).view(torch.int16))
        assert counts(client)[0] - before[0] == 64  # every listed row from HBM, none from the host
