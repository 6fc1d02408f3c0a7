"""Tokens to rows end to end: a synthetic checkpoint with a tokenizer, a real daemon, a CPU client.

The row ids come from the independent reference (tests/support/ngram_reference.py) computed from the
checkpoint's tokenizer.json and config; the client's prefetch_tokens must return exactly the
rows those ids look up.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from engram_client import EngramClient, HasherUnavailableError, TokenIdsError
from engramd.synth.writer import write_checkpoint
from ngram_reference import compressed_vocabulary, head_primes, multipliers, packed_rows
from waiting import wait_for

tokenizers = pytest.importorskip("tokenizers")


def reference_ids(checkpoint: str, tokens: list[int], starts: list[int]) -> np.ndarray:
    with open(os.path.join(checkpoint, "config.json")) as f:
        config = json.load(f)
    tokenizer = tokenizers.Tokenizer.from_file(os.path.join(checkpoint, "tokenizer.json"))
    mapping, compressed = compressed_vocabulary(lambda t: tokenizer.decode([t], skip_special_tokens=False),
                                                tokenizer.id_to_token, tokenizer.get_vocab_size(True))
    assert compressed == config["engram_compressed_vocab_size"]
    layers, max_ngram = config["engram_layer_ids"], config["engram_max_ngram_size"]
    vocab = config["engram_vocab_size"]
    primes = head_primes(layers, max_ngram, config["engram_n_heads"], [vocab] * (max_ngram - 1))
    mults = {layer: multipliers(layer, max_ngram, compressed) for layer in layers}
    return packed_rows(tokens, starts, mapping, config["engram_pad_token_id"], mults, primes, layers)


@pytest.fixture
def checkpoint(tmp_path):
    directory = str(tmp_path / "ckpt")
    write_checkpoint(directory, vocab_size=300, head_dim=64, tokenizer_vocab=400, seed=4)
    return directory


def test_prefetch_tokens_returns_the_reference_rows(daemon_factory, checkpoint):
    daemon = daemon_factory("--checkpoint", checkpoint)
    status = daemon.wait_state("ready")
    assert status["hashing"]["vocab"] == 400 and status["hashing"]["pad_token_id"] == 2
    tokenizer = tokenizers.Tokenizer.from_file(os.path.join(checkpoint, "tokenizer.json"))
    words = [tokenizer.id_to_token(i) for i in range(4, 400, 7)]
    text_ids = tokenizer.encode(" ".join(words)).ids
    tokens = text_ids + list(np.random.default_rng(2).integers(0, 400, 90))
    starts = [0, 5, len(text_ids), len(text_ids) + 1]
    expected = reference_ids(checkpoint, tokens, starts)
    with EngramClient(endpoint=daemon.endpoint, device="cpu", timeout=30) as client:
        rows = client.hasher.row_ids(torch.tensor(tokens), starts)
        np.testing.assert_array_equal(rows.numpy(), expected)
        handles = client.prefetch_tokens(torch.tensor(tokens, dtype=torch.int32), seq_starts=starts)
        assert sorted(handles) == client.layers == [1, 14]
        for index, layer in enumerate(client.layers):
            out = handles[layer].wait()
            assert out.shape == (len(tokens), 24, 64)
            wanted = client.table(layer).lookup(torch.from_numpy(expected[:, index]))
            assert torch.equal(out.view(torch.int16), wanted.view(torch.int16))
        with pytest.raises(TokenIdsError, match=r"token_ids\[1\] is 400"):
            client.prefetch_tokens(torch.tensor([1, 400]))
    with pytest.raises(HasherUnavailableError, match="closed"):
        client.hasher.row_ids(torch.tensor([1]))


def test_without_a_tokenizer_lookups_work_and_the_hasher_says_why(daemon_factory, checkpoint):
    os.unlink(os.path.join(checkpoint, "tokenizer.json"))
    daemon = daemon_factory("--checkpoint", checkpoint)
    assert daemon.wait_state("ready")["hashing"] is None
    with EngramClient(endpoint=daemon.endpoint, device="cpu", timeout=30) as client:
        assert not client.hasher.available
        with pytest.raises(HasherUnavailableError, match="no token map: its checkpoint has no tokenizer.json"):
            client.prefetch_tokens(torch.tensor([1, 2, 3]))
        assert client.table(1).lookup(torch.tensor([0, 5])).shape == (2, 64)


def test_a_tokenizer_the_config_contradicts_fails_the_load(daemon_factory, checkpoint):
    config_path = os.path.join(checkpoint, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    actual = config["engram_compressed_vocab_size"]
    config["engram_compressed_vocab_size"] = 99092
    with open(config_path, "w") as f:
        json.dump(config, f)
    daemon = daemon_factory("--checkpoint", checkpoint)
    status = daemon.wait_state("failed")
    assert f"has {actual} ids" in status["error"] and "engram_compressed_vocab_size = 99092" in status["error"]
    assert daemon.status()["state"] == "failed"  # still answering
    assert not [name for name in os.listdir(daemon.shm_dir) if ".table" in name]  # nothing half-written


def test_the_demo_table_has_a_hasher(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cpu", timeout=30) as client:
        hasher = client.hasher
        assert hasher.available and hasher.vocab == 4096 and hasher.layers == (1, 14)
        tokens = torch.arange(0, 4096, 37)
        handles = client.prefetch_tokens(tokens)
        rows = hasher.row_ids(tokens)
        for index, layer in enumerate(client.layers):
            assert torch.equal(handles[layer].wait().view(torch.int16),
                               client.table(layer).lookup(rows[:, index]).view(torch.int16))


def test_refresh_moves_the_hasher_with_the_table(daemon_factory, tmp_path):
    a, b = str(tmp_path / "ckpts" / "a"), str(tmp_path / "ckpts" / "b")
    write_checkpoint(a, vocab_size=300, head_dim=64, tokenizer_vocab=400, seed=1)
    write_checkpoint(b, vocab_size=300, head_dim=64, seed=2)  # no tokenizer
    daemon = daemon_factory("--checkpoint", a)
    daemon.wait_state("ready")
    with EngramClient(endpoint=daemon.endpoint, device="cpu", timeout=30) as client:
        old = client.hasher
        rows = old.row_ids(torch.arange(20))
        daemon.connection.request("reload", {"checkpoint": b})
        wait_for(lambda: (s := daemon.status())["generation"] == 2 and s["state"] == "ready",
                 "generation 2 to be served")
        assert client.refresh()
        with pytest.raises(HasherUnavailableError, match="has no token map"):
            client.prefetch_tokens(torch.arange(20))
        assert torch.equal(old.row_ids(torch.arange(20)), rows)  # a hasher held by the caller keeps working
