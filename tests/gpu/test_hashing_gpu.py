"""The hash on the GPU: bit-identical to the CPU hash, tokens to rows on CUDA, bad ids refused."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engram_client import EngramClient, IdsOutOfRangeError
from engram_client.hashing.hasher import hasher_for_config
from engram_client.core.layout import EngramConfig

pytestmark = pytest.mark.gpu

V41 = {"engram_vocab_size": 16000000, "engram_layer_ids": [1, 14], "engram_max_ngram_size": 4,
       "engram_n_heads": 8, "engram_head_dim": 256, "engram_num_embeddings": [384006168, 384016682]}


@pytest.fixture(scope="module")
def v41_hasher():
    ids = np.arange(129280)
    token_map = (ids * 99092 // 129280).astype(np.int32)
    return hasher_for_config(EngramConfig.from_dict(V41, source="V4.1"), token_map, 99092, pad_token_id=2)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_gpu_and_cpu_agree_bit_for_bit(v41_hasher, dtype):
    rng = np.random.default_rng(0)
    for count, starts in ((16384, [0]), (5000, [0, 1, 2, 999, 1000, 4999]), (3, [0, 1, 2])):
        tokens = torch.from_numpy(rng.integers(0, 129280, count)).to(dtype)
        history = torch.from_numpy(rng.integers(-1, 129280, (len(starts), 3)))
        for hist in (None, history):
            cpu = v41_hasher.row_ids(tokens, starts, hist)
            gpu = v41_hasher.row_ids(tokens.cuda(), starts, None if hist is None else hist.cuda())
            assert gpu.device.type == "cuda" and gpu.dtype == torch.int32
            assert torch.equal(gpu.cpu(), cpu)


@pytest.mark.parametrize("path", ["host", "uva"])
def test_bad_ids_on_the_gpu_become_rows_every_lookup_refuses(demo_daemon, path):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path=path) as client, \
            EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0", lookup_path=path, strict_ids=True) as strict:
        tokens = torch.arange(0, 4000, 13, device="cuda")
        rows = client.hasher.row_ids(tokens)
        assert torch.equal(rows.cpu(), client.hasher.row_ids(tokens.cpu()))
        bad = tokens.clone()
        bad[5] = 4096
        assert bool((client.hasher.row_ids(bad)[5] == -1).all())
        # Without strict_ids nothing blocks: the refused rows come back zeroed, and each layer's
        # table reports them once, at its first call after the lookup has finished (here the
        # handle's own wait, since the device is synchronized first).
        handles = client.prefetch_tokens(bad)
        torch.cuda.synchronize()
        for layer, handle in handles.items():
            with pytest.raises(IdsOutOfRangeError, match="in finished lookups"):
                handle.wait()
            out = handle.wait()  # reported once; the output is there all the same
            torch.cuda.synchronize()
            assert not out[5].any() and out[0].any()
            client.table(layer).prefetch(torch.tensor([1], device="cuda")).wait()  # nothing left to report
        for handle in strict.prefetch_tokens(bad).values():
            with pytest.raises(IdsOutOfRangeError):
                handle.wait()


@pytest.mark.parametrize("tokens_on", ["cpu", "cuda"])
def test_prefetch_tokens_on_cuda_equals_the_cpu_client(demo_daemon, tokens_on):
    tokens = torch.from_numpy(np.random.default_rng(1).integers(0, 4096, 3000))
    starts = [0, 100, 2000]
    with EngramClient(endpoint=demo_daemon.endpoint, device="cpu") as cpu_client:
        expected = {layer: h.wait() for layer, h in cpu_client.prefetch_tokens(tokens, starts).items()}
    with EngramClient(endpoint=demo_daemon.endpoint, device="cuda:0") as client:
        handles = client.prefetch_tokens(tokens.to(tokens_on), starts)
        for layer, handle in handles.items():
            out = handle.wait()
            assert out.device.type == "cuda" and out.shape == (3000, 24, 256)
            assert torch.equal(out.cpu().view(torch.int16), expected[layer].view(torch.int16))


@pytest.mark.parametrize("warmed", [True, False])
def test_decode_hashing_captured_in_a_graph_replays_with_new_tokens(v41_hasher, warmed):
    """A decode step (one token per sequence, with history) captured as an engine captures it:
    every replay hashes the tokens then in the static buffers, whether the seq_starts were seen
    eagerly before the capture (kept on the device) or first met inside it."""
    sequences = 256 if warmed else 255
    starts = list(range(sequences))
    rng = np.random.default_rng(5)
    tokens = torch.zeros(sequences, dtype=torch.int64, device="cuda")
    history = torch.zeros((sequences, 3), dtype=torch.int64, device="cuda")
    v41_hasher.row_ids(tokens, starts, history)  # the device tables are made eagerly, as engines warm up
    if not warmed:
        v41_hasher._starts_on_device.clear()
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        static_rows = v41_hasher.row_ids(tokens, starts, history)
    for replay in range(4):
        new_tokens = torch.from_numpy(rng.integers(0, 129280, sequences))
        new_history = torch.from_numpy(rng.integers(-1, 129280, (sequences, 3)))
        tokens.copy_(new_tokens)
        history.copy_(new_history)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_rows.cpu(), v41_hasher.row_ids(new_tokens, starts, new_history))
