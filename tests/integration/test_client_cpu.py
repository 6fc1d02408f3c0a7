"""engram_client on device="cpu" against a real daemon: the whole API, bit-exact."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from safetensors import safe_open

from engram_client import (EngramClient, EngramTimeoutError, IdsOutOfRangeError, NotAttachedError,
                           NotReadyError)
from engram_client.core.demo_rows import demo_rows
from engramd.synth.writer import write_checkpoint
from exactness import assert_bf16_exact, assert_float32_exact, bf16_bits


def test_full_api_on_the_demo_table(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cpu", timeout=30) as client:
        assert client.layers == [1, 14]
        status = client.status()
        assert [c["id"] for c in status["clients"]] == [client.client_id]
        for layer in client.layers:
            table = client.table(layer)
            assert table.head_dim == 256 and len(table.head_sizes) == 24
            assert table.num_rows == sum(table.head_sizes)
            assert table.head_offsets[0] == 0 and table.head_offsets[-1] == table.num_rows - table.head_sizes[-1]
            rng = np.random.default_rng(layer)
            ids = rng.integers(0, table.num_rows, size=(3, 5, 7))
            ids[0, 0, 0], ids[-1, -1, -1] = 0, table.num_rows - 1  # both ends of the table
            for dtype in (torch.int32, torch.int64):
                out = table.lookup(torch.from_numpy(ids).to(dtype))
                assert out.shape == (3, 5, 7, 256) and out.dtype == torch.bfloat16 and out.device.type == "cpu"
                assert_bf16_exact(out, *demo_rows(0, layer, ids.reshape(-1), 256))
            handle = table.prefetch(torch.from_numpy(ids))
            first, second = handle.wait(), handle.wait()
            assert torch.equal(first.view(torch.int16), second.view(torch.int16))
            table.prefetch(torch.from_numpy(ids))  # never waited: harmless
        assert table.lookup(torch.zeros(0, dtype=torch.int64)).shape == (0, 256)


def test_checkpoint_rows_match_the_safetensors_files(daemon_factory, tmp_path):
    ckpt = tmp_path / "ckpt"
    write_checkpoint(str(ckpt), vocab_size=300, head_dim=128, shards=3, seed=11)
    daemon = daemon_factory("--checkpoint", str(ckpt))
    daemon.wait_state("ready")
    tensors = {}
    for name in os.listdir(ckpt):
        if name.endswith(".safetensors"):
            with safe_open(str(ckpt / name), framework="pt") as f:
                for key in f.keys():
                    tensors[key] = f.get_tensor(key)
    with EngramClient(endpoint=daemon.endpoint, device="cpu") as client:
        for layer in client.layers:
            table = client.table(layer)
            weight = tensors[f"model.layers.{layer}.engram.embed.weight"].view(torch.uint8).numpy()
            scale = tensors[f"model.layers.{layer}.engram.embed.scale"].view(torch.uint8).numpy()
            ids = np.arange(table.num_rows)
            out = table.lookup(torch.from_numpy(ids))
            assert_bf16_exact(out, weight[ids], scale[ids])


def test_out_of_range_ids_are_refused_with_their_count(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cpu") as client:
        table = client.table(1)
        ids = torch.tensor([0, -1, table.num_rows, table.num_rows + 10**9, 5])
        with pytest.raises(IdsOutOfRangeError, match=r"3 of 5 ids"):
            table.lookup(ids)
        with pytest.raises(IdsOutOfRangeError):
            table.prefetch(ids)
        with pytest.raises(TypeError, match="int32 or int64"):
            table.lookup(torch.tensor([0.0]))


def test_row_range_limits_lookups(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cpu", row_ranges={14: (100, 200)}) as client:
        table = client.table(14)
        assert table.row_range == (100, 200)
        out = table.lookup(torch.arange(100, 200))
        assert_bf16_exact(out, *demo_rows(0, 14, np.arange(100, 200), 256))
        with pytest.raises(IdsOutOfRangeError, match="registered range"):
            table.lookup(torch.tensor([99]))
    with pytest.raises(ValueError, match="not within"):
        EngramClient(endpoint=demo_daemon.endpoint, device="cpu", row_ranges={14: (5, 5)})
    with pytest.raises(ValueError, match="layers \\[3\\]"):
        EngramClient(endpoint=demo_daemon.endpoint, device="cpu", row_ranges={3: (0, 1)})


def test_closed_client_refuses_and_detaches(demo_daemon):
    client = EngramClient(endpoint=demo_daemon.endpoint, device="cpu")
    client.close()
    client.close()  # twice is harmless
    with pytest.raises(NotAttachedError):
        client.table(1)
    assert demo_daemon.status()["clients"] == []


def test_lookups_survive_the_daemon_stopping(demo_daemon):
    client = EngramClient(endpoint=demo_daemon.endpoint, device="cpu")
    path = demo_daemon.status()["table_path"]
    demo_daemon.connection.request("stop")
    assert demo_daemon.proc.wait(timeout=30) == 0
    assert not os.path.exists(path)
    ids = np.arange(50)
    assert_bf16_exact(client.table(1).lookup(torch.from_numpy(ids)), *demo_rows(0, 1, ids, 256))
    started = time.monotonic()
    client.close()  # the daemon is gone: detach is bounded
    assert time.monotonic() - started < 10


def test_waits_are_bounded_and_say_what_they_wait_for(socket_dir):
    # A socket file nothing listens on (a daemon killed, maybe restarting) is waited on, bounded;
    # a missing one is said at once (test_client_reach.py).
    path = os.path.join(socket_dir, "killed.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()
    with pytest.raises(EngramTimeoutError, match=r"ready table \(socket file .* is stale"):
        EngramClient(endpoint=f"ipc://{path}", device="cpu", timeout=0.5)


def test_failed_daemon_is_reported_at_once(daemon_factory, tmp_path):
    (tmp_path / "ckpt").mkdir()
    daemon = daemon_factory("--checkpoint", str(tmp_path / "ckpt"))
    daemon.wait_state("failed")
    started = time.monotonic()
    with pytest.raises(NotReadyError, match="config.json not found"):
        EngramClient(endpoint=daemon.endpoint, device="cpu", timeout=30)
    assert time.monotonic() - started < 10


RANK = textwrap.dedent("""
    import sys, numpy as np, torch
    from engram_client import EngramClient
    from engram_client.core.demo_rows import demo_rows
    from engram_client.lookup.reference import reference_bf16_bits, same_bf16
    client = EngramClient(endpoint=sys.argv[1], device="cpu", rank=int(sys.argv[2]))
    ids = np.random.default_rng(int(sys.argv[2])).integers(0, client.table(1).num_rows, 2000)
    out = client.table(1).lookup(torch.from_numpy(ids)).view(torch.int16).numpy().view(np.uint16)
    ok = same_bf16(out, reference_bf16_bits(*demo_rows(0, 1, ids, 256))).all()
    print("exact" if ok else "MISMATCH", client.client_id, flush=True)
    mode = sys.argv[3]
    if mode == "hold":
        sys.stdin.read()
    elif mode == "write":
        client.table(1).rows_view[0] = 1  # the mapping is read-only: this must fault
    # "exit": leave without close(); interpreter exit must detach
""")


def start_rank(endpoint: str, rank: int, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RANK, endpoint, str(rank), mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def test_several_rank_processes_share_one_table(demo_daemon):
    ranks = [start_rank(demo_daemon.endpoint, rank, "hold") for rank in range(4)]
    try:
        lines = [proc.stdout.readline().split() for proc in ranks]
        assert all(line[0] == "exact" for line in lines), lines
        clients = demo_daemon.status()["clients"]
        assert sorted(c["id"] for c in clients) == sorted(line[1] for line in lines)
        assert sorted(c["rank"] for c in clients) == [0, 1, 2, 3]
        assert {c["pid"] for c in clients} == {proc.pid for proc in ranks}
    finally:
        for proc in ranks:
            proc.stdin.close()
            proc.wait(timeout=30)
    assert demo_daemon.status()["clients"] == []


def test_normal_exit_detaches_at_once(demo_daemon):
    proc = start_rank(demo_daemon.endpoint, 0, "exit")
    assert proc.stdout.readline().startswith("exact")
    assert proc.wait(timeout=30) == 0
    assert demo_daemon.status()["clients"] == []


def test_killed_client_lease_expires(demo_daemon):
    proc = start_rank(demo_daemon.endpoint, 0, "hold")
    assert proc.stdout.readline().startswith("exact")
    assert len(demo_daemon.status()["clients"]) == 1
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10 * 1.5
    while demo_daemon.status()["clients"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert demo_daemon.status()["clients"] == [], "the killed client's lease never expired"


def test_mapping_is_read_only(demo_daemon):
    proc = start_rank(demo_daemon.endpoint, 0, "write")
    assert proc.stdout.readline().startswith("exact")
    assert proc.wait(timeout=30) == -signal.SIGSEGV
    ids = np.arange(10)
    with EngramClient(endpoint=demo_daemon.endpoint, device="cpu") as client:
        assert_bf16_exact(client.table(1).lookup(torch.from_numpy(ids)), *demo_rows(0, 1, ids, 256))


def test_every_fp8_byte_against_every_awkward_scale(special_daemon):
    daemon, weight, scale = special_daemon
    with EngramClient(endpoint=daemon.endpoint, device="cpu") as client:
        table = client.table(3)
        ids = np.arange(table.num_rows)
        out = table.lookup(torch.from_numpy(ids))
        assert_bf16_exact(out, weight, scale)
        raw = bf16_bits(out)
        assert ((raw & 0x7FFF) == 0x7F80).any(), "no overflow to inf was exercised"
        assert (((raw & 0x7F80) == 0) & ((raw & 0x7F) != 0)).any(), "no bf16 subnormal was exercised"
    with EngramClient(endpoint=daemon.endpoint, device="cpu", out_dtype=torch.float32) as client:
        out32 = client.table(3).lookup(torch.from_numpy(ids))
        assert_float32_exact(out32, weight, scale)

