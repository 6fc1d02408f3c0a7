"""The token hash against the independent reference (tests/support/ngram_reference.py), on the CPU:
the C extension and the numpy fallback, packed sequences, decode continuation, bad input."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_client.core.errors import HasherUnavailableError, TokenIdsError
from engram_client.hashing import cpu
from engram_client.hashing.hasher import NgramHasher, UnavailableHasher, hasher_for_config
from engram_client.core.hashing_section import ngram_multipliers
from engram_client.core.layout import EngramConfig, build_layout
from ngram_reference import head_primes, multipliers, packed_rows

V41 = {"engram_vocab_size": 16000000, "engram_layer_ids": [1, 14], "engram_max_ngram_size": 4,
       "engram_n_heads": 8, "engram_head_dim": 256, "engram_num_embeddings": [384006168, 384016682]}
SMALL = {"engram_vocab_size": [300, 500, 700], "engram_layer_ids": [3, 0, 9], "engram_max_ngram_size": 4,
         "engram_n_heads": 3, "engram_head_dim": 32}


def small_config() -> EngramConfig:
    probe = EngramConfig.from_dict({**SMALL, "engram_num_embeddings": 0}, source="small")
    from engram_client.core.layout import head_sizes
    rows = [sum(sizes) for sizes in head_sizes(probe)]
    return EngramConfig.from_dict({**SMALL, "engram_num_embeddings": rows}, source="small")


def small_map(vocab: int = 400, seed: int = 1) -> tuple[np.ndarray, int]:
    """A map in first-appearance order that folds some ids together."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, vocab // 2, vocab)
    first: dict[int, int] = {}
    token_map = np.array([first.setdefault(int(k), len(first)) for k in keys], dtype=np.int32)
    return token_map, len(first)


@pytest.fixture(params=["c", "numpy"])
def backend(request, monkeypatch):
    if request.param == "c" and cpu.cpu_backend() != "c":
        pytest.skip("the C extension was not built")
    if request.param == "numpy":
        monkeypatch.setattr(cpu, "_hash_rows_c", None)
    return request.param


def reference_for(config: EngramConfig, token_map: np.ndarray, compressed: int, pad: int):
    mults = {layer: multipliers(layer, config.max_ngram, compressed) for layer in config.layer_ids}
    primes = head_primes(config.layer_ids, config.max_ngram, config.n_heads, config.vocab_sizes)
    return lambda tokens, starts: packed_rows(list(tokens), starts, token_map.tolist(), pad, mults, primes,
                                              config.layer_ids)


def test_v41_multipliers_and_primes_match_the_reference():
    config = EngramConfig.from_dict(V41, source="V4.1")
    for layer in config.layer_ids:
        assert list(ngram_multipliers(layer, 4, 99092)) == multipliers(layer, 4, 99092)
        assert all(m % 2 == 1 and m * 99091 < 2**63 for m in multipliers(layer, 4, 99092))
    primes = head_primes(config.layer_ids, 4, 8, config.vocab_sizes)
    layouts = build_layout(config)  # raises if the heads do not sum to engram_num_embeddings
    assert [layout.rows for layout in layouts] == [384006168, 384016682]
    for layout in layouts:
        assert list(layout.head_sizes) == [p for order in primes[layout.layer] for p in order]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_packed_sequences_match_the_reference(backend, dtype):
    config = small_config()
    token_map, compressed = small_map()
    hasher = hasher_for_config(config, token_map, compressed, pad_token_id=2)
    reference = reference_for(config, token_map, compressed, 2)
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, token_map.size, 200)
    tokens[:4] = 2  # pad tokens inside a sequence hash like any other
    for starts in ([0], [0, 1, 2, 50, 51, 199], [0, 3, 100]):
        rows = hasher.row_ids(torch.from_numpy(tokens).to(dtype), starts)
        assert rows.shape == (200, 3, 9) and rows.dtype == torch.int32
        np.testing.assert_array_equal(rows.numpy(), reference(tokens, starts))
    assert hasher.layers == (3, 0, 9)


def test_sequence_starts_isolate_sequences(backend):
    config = small_config()
    token_map, compressed = small_map()
    hasher = hasher_for_config(config, token_map, compressed, pad_token_id=2)
    a, b = torch.arange(10, 30), torch.arange(100, 107)
    packed = hasher.row_ids(torch.cat([a, b]), seq_starts=torch.tensor([0, 20]))
    assert torch.equal(packed[:20], hasher.row_ids(a)) and torch.equal(packed[20:], hasher.row_ids(b))
    # Without the start, b's first tokens would see a's last ones.
    assert not torch.equal(hasher.row_ids(torch.cat([a, b]))[20:], packed[20:])


def test_decode_continuation_equals_whole_sequence(backend):
    config = small_config()
    token_map, compressed = small_map()
    hasher = hasher_for_config(config, token_map, compressed, pad_token_id=2)
    rng = np.random.default_rng(9)
    lengths = [1, 2, 3, 9, 40]
    sequences = [torch.from_numpy(rng.integers(0, token_map.size, n)) for n in lengths]
    whole = [hasher.row_ids(s) for s in sequences]
    for step in range(max(lengths)):
        live = [i for i, n in enumerate(lengths) if step < n]
        history = torch.full((len(live), 3), -1, dtype=torch.int64)
        for row, i in enumerate(live):
            earlier = sequences[i][max(0, step - 3):step]
            if earlier.numel():
                history[row, 3 - earlier.numel():] = earlier
        new = torch.stack([sequences[i][step] for i in live])
        rows = hasher.row_ids(new, seq_starts=list(range(len(live))), history=history)
        for row, i in enumerate(live):
            assert torch.equal(rows[row], whole[i][step]), (i, step)


def test_c_and_numpy_agree_on_v41_geometry(monkeypatch):
    if cpu.cpu_backend() != "c":
        pytest.skip("the C extension was not built")
    config = EngramConfig.from_dict(V41, source="V4.1")
    token_map, compressed = small_map(vocab=5000)
    hasher = hasher_for_config(config, token_map, compressed, pad_token_id=2)
    tokens = torch.from_numpy(np.random.default_rng(3).integers(0, 5000, 3000))
    starts = [0, 1000, 1001, 2500]
    history = torch.from_numpy(np.random.default_rng(4).integers(-1, 5000, (4, 3)))
    fast = hasher.row_ids(tokens, starts, history)
    monkeypatch.setattr(cpu, "_hash_rows_c", None)
    assert torch.equal(fast, hasher.row_ids(tokens, starts, history))
    reference = reference_for(config, token_map, compressed, 2)
    np.testing.assert_array_equal(hasher.row_ids(tokens[:1000]).numpy(), reference(tokens[:1000].tolist(), [0]))


def test_bad_inputs_get_clear_errors(backend):
    config = small_config()
    token_map, compressed = small_map()
    hasher = hasher_for_config(config, token_map, compressed, pad_token_id=2)
    good = torch.arange(10)
    with pytest.raises(TokenIdsError, match=r"token_ids\[3\] is -1, outside .*\[0, 400\)"):
        hasher.row_ids(torch.tensor([1, 2, 3, -1, 4]))
    with pytest.raises(TokenIdsError, match=r"token_ids\[1\] is 400, outside"):
        hasher.row_ids(torch.tensor([1, 400], dtype=torch.int32))
    with pytest.raises(TokenIdsError, match="int32 or int64, got torch.float32"):
        hasher.row_ids(good.float())
    with pytest.raises(TokenIdsError, match="must be a torch.Tensor"):
        hasher.row_ids([1, 2, 3])
    with pytest.raises(TokenIdsError, match="1-D"):
        hasher.row_ids(good.view(2, 5))
    for starts in ([1], [0, 0], [0, 10], [0, 5, 3], []):
        with pytest.raises(TokenIdsError, match="seq_starts"):
            hasher.row_ids(good, starts)
    with pytest.raises(TokenIdsError, match=r"history must have shape \(2, 3\)"):
        hasher.row_ids(good, [0, 5], torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(TokenIdsError, match=r"history\[1, 2\] is 400"):
        hasher.row_ids(good, [0, 5], torch.tensor([[1, 2, 3], [-1, 5, 400]]))
    assert hasher.row_ids(torch.zeros(0, dtype=torch.int64)).shape == (0, 3, 9)


def test_unavailable_hasher_says_why():
    hasher = UnavailableHasher("the table has no token map")
    assert not hasher.available
    with pytest.raises(HasherUnavailableError, match="the table has no token map"):
        hasher.row_ids(torch.arange(3))
    import copy
    assert copy.copy(hasher).reason == hasher.reason


def test_rows_are_int64_where_a_layer_passes_int32():
    config = EngramConfig.from_dict({**SMALL, "engram_vocab_size": 2**31 // 9 + 100, "engram_num_embeddings": 0,
                                     "engram_n_heads": 3}, source="big")
    from engram_client.core.layout import LayerLayout
    layouts = [LayerLayout(layer, 32, (2**31 // 9 + 101,) * 9) for layer in config.layer_ids]
    token_map, compressed = small_map()
    from engram_client.core.hashing_section import HashingSection
    section = HashingSection.build(token_map, compressed, 2, 4, config.layer_ids)
    rows = NgramHasher(section, token_map, layouts).row_ids(torch.arange(5))
    assert rows.dtype == torch.int64 and int(rows.max()) >= 2**31 - 1 - 2**31 // 9


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_random_batches_with_history_match_the_reference(data):
    """Packed batches with history equal the reference hashing each sequence with its history
    prepended (and the history's own rows dropped)."""
    config = small_config()
    token_map, compressed = small_map()
    hasher = hasher_for_config(config, token_map, compressed, pad_token_id=2)
    reference = reference_for(config, token_map, compressed, 2)
    lengths = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=5))
    token = st.integers(0, token_map.size - 1)
    sequences = [data.draw(st.lists(token, min_size=n, max_size=n)) for n in lengths]
    histories = [data.draw(st.lists(token, min_size=0, max_size=3)) for _ in lengths]
    history = torch.tensor([[-1] * (3 - len(h)) + h for h in histories], dtype=torch.int64)
    starts = np.cumsum([0] + lengths[:-1]).tolist()
    rows = hasher.row_ids(torch.tensor(sum(sequences, [])), starts, history)
    for seq, earlier, begin in zip(sequences, histories, starts):
        expected = reference(earlier + seq, [0])[len(earlier):]
        np.testing.assert_array_equal(rows[begin:begin + len(seq)].numpy(), expected)
