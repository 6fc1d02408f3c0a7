"""engram_client on CUDA: registration, the UVA kernel's exactness, prefetch, sharing.

The host-gather path has its own file (test_host_path_gpu.py); tests here that exercise the
Triton lookup kernel ask for lookup_path="uva"."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from engram_client import EngramClient, IdsOutOfRangeError
from engram_client.core.demo_rows import demo_rows
from exactness import assert_bf16_exact, assert_float32_exact

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("ids_on", ["cpu", "cuda"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("strategy", ["dedup", "direct"])
def test_kernel_is_exact_on_every_dtype_path(special_daemon, id_dtype, ids_on, out_dtype, strategy):
    daemon, weight, scale = special_daemon
    with EngramClient(endpoint=daemon.endpoint, device="cuda:0", out_dtype=out_dtype,
                      lookup_strategy=strategy, lookup_path="uva") as client:
        table = client.table(3)
        rng = np.random.default_rng(0)
        ids = np.concatenate([np.arange(table.num_rows), rng.integers(0, table.num_rows, 5000)])
        out = table.lookup(torch.from_numpy(ids).to(id_dtype).to(ids_on))
        assert out.device == client.device and out.dtype == out_dtype and out.shape == (ids.size, 256)
        check = assert_bf16_exact if out_dtype == torch.bfloat16 else assert_float32_exact
        check(out, weight[ids], scale[ids])


def test_demo_table_exact_with_shaped_ids(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0") as client:
        for layer in client.layers:
            table = client.table(layer)
            ids = np.random.default_rng(layer).integers(0, table.num_rows, size=(4, 33, 24))
            out = table.lookup(torch.from_numpy(ids).cuda())
            assert out.shape == (4, 33, 24, 256)
            assert_bf16_exact(out, *demo_rows(0, layer, ids.reshape(-1), 256))


@pytest.mark.parametrize("strategy", ["dedup", "direct"])
def test_out_of_range_ids_on_the_gpu_raise_at_a_strict_wait(demo_daemon, strategy):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_strategy=strategy,
                      lookup_path="uva", strict_ids=True) as client:
        table = client.table(1)
        ids = torch.tensor([0, -5, table.num_rows, 2**40, 7, -5], device="cuda")
        handle = table.prefetch(ids)  # ids live on the GPU: counted by the kernel, reported at wait
        assert handle.blocks_host
        with pytest.raises(IdsOutOfRangeError, match="4 ids in finished lookups"):  # a repeated bad id counts twice
            handle.wait()
        with pytest.raises(IdsOutOfRangeError, match="4 ids"):
            handle.wait()
        with pytest.raises(IdsOutOfRangeError, match="4 of 6"):
            table.lookup(ids.cpu())
        good = torch.arange(10, device="cuda")
        assert_bf16_exact(table.lookup(good), *demo_rows(0, 1, np.arange(10), 256))


def test_prefetch_on_a_non_default_stream_overlapping_work(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0") as client:
        table = client.table(14)
        side = torch.cuda.Stream()
        a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
        results = []
        with torch.cuda.stream(side):
            for step in range(8):
                ids = torch.randint(0, table.num_rows, (6144,), device="cuda")  # produced on `side`
                handle = table.prefetch(ids)
                for _ in range(4):
                    a = torch.tanh(a @ a)  # work that the lookup overlaps
                out = handle.wait()
                results.append((ids.cpu().numpy(), out.float().sum().item(), out))
        torch.cuda.synchronize()
        for ids, _, out in results:
            assert_bf16_exact(out, *demo_rows(0, 14, ids, 256))
        handles = [table.prefetch(torch.randint(0, table.num_rows, (1000,), device="cuda")) for _ in range(5)]
        del handles  # dropped without wait: buffers stay alive until the kernels are done
        torch.cuda.synchronize()


def test_row_range_registration_on_gpu(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", row_ranges={1: (1000, 5000)}) as client:
        table = client.table(1)
        ids = np.arange(1000, 5000)
        assert_bf16_exact(table.lookup(torch.from_numpy(ids).cuda()), *demo_rows(0, 1, ids, 256))
        with pytest.raises(IdsOutOfRangeError, match="registered range"):
            table.lookup(torch.tensor([999]))
        handle = table.prefetch(torch.tensor([999, 1000], device="cuda"))  # on the GPU: zeroed, reported later
        torch.cuda.synchronize()
        with pytest.raises(IdsOutOfRangeError, match="1 ids in finished lookups were outside .*registered range"):
            handle.wait()
        out = handle.wait()  # reported once; the rows are there, the bad one zeroed
        assert not out[0].any() and out[1].any()


RANK = textwrap.dedent("""
    import os, sys, numpy as np, torch
    sys.path.insert(0, sys.argv[4])
    from engram_client import EngramClient
    from engram_client.core.demo_rows import demo_rows
    from exactness import assert_bf16_exact
    client = EngramClient(endpoint=sys.argv[1], device=sys.argv[2], rank=int(sys.argv[3]))
    for layer in client.layers:
        ids = np.random.default_rng(int(sys.argv[3])).integers(0, client.table(layer).num_rows, 20000)
        assert_bf16_exact(client.table(layer).lookup(torch.from_numpy(ids).to(client.device)),
                          *demo_rows(0, layer, ids, 256))
    path = client.status()["table_path"]
    pss = 0
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            if "-" in line.split()[0] and len(line.split()) >= 5:
                inside = line.rstrip().endswith(path)
            elif inside and line.startswith("Pss:"):
                pss += int(line.split()[1]) * 1024
    print("exact", pss, flush=True)
    sys.stdin.read()
""")


def _ranks(endpoint: str, devices: list[str]) -> list[subprocess.Popen]:
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
    return [subprocess.Popen([sys.executable, "-c", RANK, endpoint, device, str(rank), here],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for rank, device in enumerate(devices)]


def _shm_used(path: str) -> int:
    stat = os.statvfs(path)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


def _run_shared(daemon, devices: list[str]) -> dict:
    table_bytes = daemon.status()["table_bytes"]
    procs = _ranks(daemon.endpoint, devices)
    try:
        lines = [proc.stdout.readline().split() for proc in procs]
        assert all(line and line[0] == "exact" for line in lines), lines
        pss = [int(line[1]) for line in lines]
        assert len(daemon.status()["clients"]) == len(devices)
        record = {"ranks": len(devices), "table_bytes": table_bytes, "shm_used": _shm_used(daemon.shm_dir),
                  "pss_per_rank": pss, "pss_sum": sum(pss)}
        print("shared-table memory:", record)
        # Registration pins every page of every layer, so each rank maps all the rows; PSS splits
        # shared pages between the ranks: together they account for one table's rows, not N.
        row_bytes = sum(layer["rows"] * (layer["head_dim"] + layer["head_dim"] // 32)
                        for layer in daemon.status()["layers"])
        assert table_bytes <= record["shm_used"] < 2 * table_bytes  # one table in /dev/shm
        assert 0.98 * row_bytes <= sum(pss) <= table_bytes
        assert max(pss) <= 1.1 * row_bytes / len(devices)
        return record
    finally:
        for proc in procs:
            proc.stdin.close()
            proc.wait(timeout=60)


def test_several_processes_on_one_gpu_share_one_table(demo_daemon):
    _run_shared(demo_daemon, ["cuda:0"] * 4)


def test_two_processes_on_two_gpus(demo_daemon):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (nvidia-h200-x2)")
    _run_shared(demo_daemon, ["cuda:0", "cuda:1"])


@pytest.mark.parametrize("strategy", ["auto", "dedup", "direct"])
def test_the_uva_path_serves_from_the_hbm_row_cache_exactly(demo_daemon, strategy):
    """The one HBM row cache (lookup/cache/) on the UVA path, which has no gather pool: rows exact,
    every call through the cache in stream order, a Zipf stream mostly held, bad ids still counted,
    and close disarms it (tests/gpu/test_hot_cache_gpu.py has the host path's side)."""
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_strategy=strategy,
                      hot_cache_bytes=8 << 20, strict_ids=True, lookup_path="uva") as client:
        table = client.table(14)
        cache = table._rows.hbm_cache
        assert cache is not None and client._state.pool is None and table.max_programs >= 1
        rng = np.random.default_rng(7)
        for step in range(12):
            ids = (rng.zipf(1.2, 20000) * 7919) % table.num_rows  # hot rows, scattered over the table
            out = table.lookup(torch.from_numpy(ids).cuda())
            assert_bf16_exact(out, *demo_rows(0, 14, ids, 256))
        assert int(cache.control[0]) == 12, "every call classified and committed, in stream order"
        held = torch.cat([cache.fixed_keys[:cache.fixed_count], cache.recent_keys[cache.recent_keys >= 0]])
        assert int(torch.isin(torch.from_numpy(ids).cuda(), held).sum()) > ids.size // 2, \
            "a Zipf stream should mostly be held by the cache"
        assert_bf16_exact(table.lookup(held), *demo_rows(0, 14, held.cpu().numpy(), 256))
        bad = torch.tensor([int(held[0]), -1, table.num_rows], device="cuda")
        with pytest.raises(IdsOutOfRangeError, match="2 ids in finished lookups"):
            table.lookup(bad)
    assert not cache.armed


def test_hot_row_cache_needs_cuda_and_a_sane_budget(demo_daemon):
    with pytest.raises(ValueError, match="hot_cache_bytes"):
        EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", hot_cache_bytes=-1)


# The refused capture leaves an empty graph behind, and torch warns about it: expected here.
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")
def test_a_uva_only_client_refuses_a_prefill_size_lookup_inside_a_cuda_graph_capture_clearly(demo_daemon):
    """Decode-size calls of such a client are captured on the kernel (tests/gpu/test_decode_path_gpu.py);
    a larger one's sort needs sizes only its ids give, so it is refused before anything is enqueued."""
    from engram_client import NotCapturableError
    from engram_client.lookup.config import DECODE_ROWS

    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path="uva") as client:
        table = client.table(1)
        ids = torch.arange(DECODE_ROWS + 1, device="cuda") % table.num_rows
        table.lookup(ids)  # warm: kernels compiled, buffers cached
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            with pytest.raises(NotCapturableError, match="need the host path"):
                with torch.cuda.graph(graph, stream=side):
                    table.prefetch(ids)
        # Outside the capture the same lookup works, and is exact.
        assert_bf16_exact(table.lookup(ids), *demo_rows(0, 1, ids.cpu().numpy(), 256))


@pytest.mark.parametrize("path", ["uva", "host"])
def test_lookups_never_block_the_host_and_a_strict_wait_times_out(demo_daemon, path):
    from engram_client import EngramTimeoutError

    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path=path) as client, \
            EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path=path, strict_ids=True) as strict:
        table = client.table(14)
        ids = np.random.default_rng(3).integers(0, table.num_rows, 6144)
        # Warm: kernels compiled, for ids from the host and on the GPU alike (a UVA client launches the
        # two on different kernels: lookup_kernel.py's ARMED), so that no compile outlasts the sleep below.
        table.lookup(torch.from_numpy(ids).cuda())
        table.lookup(torch.from_numpy(ids))
        gpu_ids = torch.from_numpy(ids[::-1].copy()).cuda()  # a pageable copy syncs: make it before the sleep
        # Hold the caller's stream for a long while: the lookups, ordered after it, cannot start.
        torch.cuda._sleep(2_000_000_000)
        from_host = table.prefetch(torch.from_numpy(ids))
        assert not from_host.blocks_host, "ids from the host were range-checked there"
        rows = from_host.wait()  # returns while the GPU still sleeps: only stream-ordered
        assert not from_host.done()
        from_gpu = table.prefetch(gpu_ids)
        assert not from_gpu.blocks_host, "ids on the GPU are reported later, without a host sync"
        gpu_rows = from_gpu.wait()
        strict_gpu = strict.table(14).prefetch(gpu_ids)
        assert strict_gpu.blocks_host
        with pytest.raises(EngramTimeoutError, match="lookup of 6144 ids in layer 14's rows"):
            strict_gpu.wait(timeout=0.05)
        torch.cuda.synchronize()
        assert_bf16_exact(rows, *demo_rows(0, 14, ids, 256))
        assert_bf16_exact(gpu_rows, *demo_rows(0, 14, ids[::-1].copy(), 256))
        assert_bf16_exact(strict_gpu.wait(), *demo_rows(0, 14, ids[::-1].copy(), 256))
        if path == "uva":
            assert int(table._unused_count()) == 0, "the shared counter of host-checked calls was written"


def test_ids_on_another_gpu_are_moved_and_counted_there(demo_daemon):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (nvidia-h200-x2)")
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0") as client:
        table = client.table(1)
        ids = np.random.default_rng(5).integers(0, table.num_rows, 3000)
        handle = table.prefetch(torch.from_numpy(ids).to("cuda:1"))
        out = handle.wait()
        assert out.device == torch.device("cuda:0")
        assert_bf16_exact(out, *demo_rows(0, 1, ids, 256))
        handle = table.prefetch(torch.tensor([0, table.num_rows], device="cuda:1"))  # counted on cuda:0
        torch.cuda.synchronize()
        with pytest.raises(IdsOutOfRangeError, match="1 ids in finished lookups"):
            table.lookup(torch.tensor([0], device="cuda:1"))
        assert not handle.wait()[1].any()
