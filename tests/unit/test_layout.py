"""Engram geometry from config: V4.1's published figures, config forms, and refusals.

Primality is checked here by trial division (and Lucas-Lehmer for Mersenne numbers),
never by ``layout.is_prime``, so a wrong Miller-Rabin cannot vouch for itself.
"""
from __future__ import annotations

import json
import math

import pytest

from engram_client.core.errors import LayoutError
from engram_client.core.layout import QUANT_BLOCK, EngramConfig, LayerLayout, build_layout, head_sizes, is_prime
from engram_client.core.primes import BLOCK, PrimeBlocks

# DeepSeek-V4.1's config values and its published per-layer row counts.
V41 = {"engram_vocab_size": 16000000, "engram_layer_ids": [1, 14], "engram_max_ngram_size": 4,
       "engram_n_heads": 8, "engram_head_dim": 256, "engram_num_embeddings": [384006168, 384016682]}
V41_ROWS = (384006168, 384016682)
INT_FIELDS = ("engram_max_ngram_size", "engram_n_heads", "engram_head_dim", "engram_vocab_size",
              "engram_num_embeddings")


def prime_by_trial_division(n: int) -> bool:
    if n < 2:
        return False
    if n < 4:
        return True
    if n % 2 == 0:
        return False
    return all(n % d for d in range(3, math.isqrt(n) + 1, 2))


def mersenne_prime_by_lucas_lehmer(p: int) -> bool:
    """Whether 2**p - 1 is prime, for an odd prime p."""
    m, s = (1 << p) - 1, 4
    for _ in range(p - 2):
        s = (s * s - 2) % m
    return s == 0


def reference_head_sizes(vocab_sizes, n_layers, n_heads):
    """The documented rule, spelled out with an independent primality test."""
    taken, layers = set(), []
    for _ in range(n_layers):
        sizes = []
        for vocab in vocab_sizes:
            for _ in range(n_heads):
                candidate = vocab
                while candidate in taken or not prime_by_trial_division(candidate):
                    candidate += 1
                taken.add(candidate)
                sizes.append(candidate)
        layers.append(tuple(sizes))
    return layers


def write_config(tmp_path, raw) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    return str(path)


# --- V4.1's published layout -------------------------------------------------

def test_v41_layer_rows_match_published_figures():
    layouts = build_layout(EngramConfig.from_dict(V41))
    assert [layout.layer for layout in layouts] == [1, 14]
    assert tuple(layout.rows for layout in layouts) == V41_ROWS
    assert all(len(layout.head_sizes) == 3 * 8 for layout in layouts)


def test_v41_heads_are_distinct_primes_each_the_smallest_unused():
    layouts = build_layout(EngramConfig.from_dict(V41))
    flat = [size for layout in layouts for size in layout.head_sizes]
    assert len(flat) == 48
    assert len(set(flat)) == 48
    primes = [n for n in range(16000000, max(flat) + 1) if prime_by_trial_division(n)]
    taken: set[int] = set()
    for size in flat:  # (layer, order, head) order
        assert prime_by_trial_division(size), size
        smallest_free = next(p for p in primes if p not in taken)
        assert size == smallest_free
        taken.add(size)


def test_v41_layout_geometry():
    for layout in build_layout(EngramConfig.from_dict(V41)):
        assert layout.head_dim == 256
        assert layout.scale_cols == 256 // QUANT_BLOCK
        assert layout.row_bytes == layout.head_dim + layout.scale_cols
        assert layout.head_offsets == tuple(sum(layout.head_sizes[:i]) for i in range(len(layout.head_sizes)))
        assert LayerLayout.from_dict(layout.to_dict()) == layout
        assert layout.to_dict()["rows"] == layout.rows


def test_per_order_vocab_sizes_follow_the_rule():
    raw = {"engram_layer_ids": [3, 0], "engram_max_ngram_size": 4, "engram_n_heads": 2, "engram_head_dim": 64,
           "engram_vocab_size": [100, 200, 50]}
    expected = reference_head_sizes([100, 200, 50], n_layers=2, n_heads=2)
    raw["engram_num_embeddings"] = [sum(sizes) for sizes in expected]
    config = EngramConfig.from_dict(raw)
    assert config.vocab_sizes == (100, 200, 50)
    assert head_sizes(config) == expected
    assert [layout.head_sizes for layout in build_layout(config)] == expected
    assert [layout.layer for layout in build_layout(config)] == [3, 0]


# --- config forms --------------------------------------------------------------

def test_fields_under_text_config_equal_top_level():
    top = EngramConfig.from_dict(V41)
    nested = EngramConfig.from_dict({"architectures": ["DeepseekV4ForCausalLM"], "text_config": dict(V41)})
    assert nested == top
    assert build_layout(nested) == build_layout(top)


def test_text_config_without_engram_fields_falls_back_to_top_level():
    raw = dict(V41, text_config={"hidden_size": 7168})
    assert EngramConfig.from_dict(raw) == EngramConfig.from_dict(V41)


def test_vocab_size_int_equals_per_order_list():
    as_int = EngramConfig.from_dict(V41)
    as_list = EngramConfig.from_dict(dict(V41, engram_vocab_size=[16000000] * 3))
    assert as_int.vocab_sizes == as_list.vocab_sizes == (16000000,) * 3
    assert build_layout(as_int) == build_layout(as_list)


def test_num_embeddings_int_applies_to_every_layer():
    one_layer = dict(V41, engram_layer_ids=[1], engram_num_embeddings=V41_ROWS[0])
    config = EngramConfig.from_dict(one_layer)
    assert config.num_embeddings == (V41_ROWS[0],)
    assert build_layout(config)[0].rows == V41_ROWS[0]
    as_list = EngramConfig.from_dict(dict(one_layer, engram_num_embeddings=[V41_ROWS[0]]))
    assert build_layout(as_list) == build_layout(config)


def test_from_file_reads_config(tmp_path):
    path = write_config(tmp_path, {"text_config": V41})
    config = EngramConfig.from_file(path)
    assert config.source == path
    assert tuple(layout.rows for layout in build_layout(config)) == V41_ROWS


# --- refusals --------------------------------------------------------------------

def test_num_embeddings_disagreeing_with_heads_names_file_and_both_numbers(tmp_path):
    stated = V41_ROWS[1] + 1
    path = write_config(tmp_path, dict(V41, engram_num_embeddings=[V41_ROWS[0], stated]))
    config = EngramConfig.from_file(path)
    with pytest.raises(LayoutError) as info:
        build_layout(config)
    message = str(info.value)
    assert path in message
    assert "engram_num_embeddings" in message
    assert str(stated) in message and str(V41_ROWS[1]) in message
    assert "layer 14" in message


def test_num_embeddings_int_for_layers_of_different_sizes_is_refused():
    with pytest.raises(LayoutError) as info:
        build_layout(EngramConfig.from_dict(dict(V41, engram_num_embeddings=V41_ROWS[0])))
    assert str(V41_ROWS[0]) in str(info.value) and str(V41_ROWS[1]) in str(info.value)


@pytest.mark.parametrize("missing", sorted(V41))
def test_missing_field_is_named(tmp_path, missing):
    raw = {k: v for k, v in V41.items() if k != missing}
    path = write_config(tmp_path, raw)
    with pytest.raises(LayoutError) as info:
        EngramConfig.from_file(path)
    assert path in str(info.value)
    assert missing in str(info.value)


@pytest.mark.parametrize("name", INT_FIELDS)
@pytest.mark.parametrize("bad", [True, False, "8", 8.0, None])
def test_bad_integer_field_is_named(name, bad):
    with pytest.raises(LayoutError) as info:
        EngramConfig.from_dict(dict(V41, **{name: bad}), source="cfg.json")
    assert "cfg.json" in str(info.value)
    assert name in str(info.value)


@pytest.mark.parametrize("bad", ["1,14", 1, [1, True], [1, "14"], [1.0, 14]])
def test_bad_layer_ids_are_named(bad):
    with pytest.raises(LayoutError) as info:
        EngramConfig.from_dict(dict(V41, engram_layer_ids=bad), source="cfg.json")
    assert "cfg.json" in str(info.value)
    assert "engram_layer_ids" in str(info.value)


@pytest.mark.parametrize("name", ["engram_vocab_size", "engram_num_embeddings"])
def test_bool_inside_list_is_refused(name):
    value = [16000000, True, 16000000] if name == "engram_vocab_size" else [V41_ROWS[0], True]
    with pytest.raises(LayoutError, match=name):
        EngramConfig.from_dict(dict(V41, **{name: value}))


@pytest.mark.parametrize("head_dim", [0, 16, 48, 100, 255, -32])
def test_head_dim_not_multiple_of_32_is_refused(head_dim):
    with pytest.raises(LayoutError) as info:
        EngramConfig.from_dict(dict(V41, engram_head_dim=head_dim), source="cfg.json")
    assert "engram_head_dim" in str(info.value)
    assert str(head_dim) in str(info.value)
    assert "cfg.json" in str(info.value)


@pytest.mark.parametrize("vocab", [[], [16000000], [16000000] * 2, [16000000] * 4])
def test_vocab_list_of_wrong_length_is_refused(vocab):
    with pytest.raises(LayoutError) as info:
        EngramConfig.from_dict(dict(V41, engram_vocab_size=vocab), source="cfg.json")
    assert "engram_vocab_size" in str(info.value)
    assert str(len(vocab)) in str(info.value)
    assert "cfg.json" in str(info.value)


def test_num_embeddings_list_of_wrong_length_is_refused():
    with pytest.raises(LayoutError, match="engram_num_embeddings"):
        EngramConfig.from_dict(dict(V41, engram_num_embeddings=[V41_ROWS[0]]))


@pytest.mark.parametrize("layer_ids", [[1, 1], [14, 1, 14]])
def test_duplicated_layer_ids_are_refused(layer_ids):
    raw = dict(V41, engram_layer_ids=layer_ids, engram_num_embeddings=V41_ROWS[0])
    with pytest.raises(LayoutError) as info:
        EngramConfig.from_dict(raw, source="cfg.json")
    assert "engram_layer_ids" in str(info.value) and "cfg.json" in str(info.value)


@pytest.mark.parametrize("changes", [{"engram_layer_ids": []}, {"engram_layer_ids": [-1, 14]},
                                     {"engram_max_ngram_size": 1, "engram_vocab_size": []},
                                     {"engram_n_heads": 0}, {"engram_vocab_size": [16000000, 0, 16000000]}])
def test_out_of_range_values_are_refused(changes):
    with pytest.raises(LayoutError):
        EngramConfig.from_dict(dict(V41, **changes))


def test_unreadable_config_files_raise_layout_error(tmp_path):
    with pytest.raises(LayoutError, match="not found"):
        EngramConfig.from_file(str(tmp_path / "absent.json"))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(LayoutError, match=str(broken)):
        EngramConfig.from_file(str(broken))
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    with pytest.raises(LayoutError, match=str(listing)):
        EngramConfig.from_file(str(listing))


# --- is_prime ------------------------------------------------------------------

@pytest.mark.parametrize("start, stop", [(-5, 20000), (16000000, 16004000), (2**31 - 2000, 2**31 + 100)])
def test_is_prime_agrees_with_trial_division(start, stop):
    wrong = [n for n in range(start, stop) if is_prime(n) != prime_by_trial_division(n)]
    assert wrong == []


@pytest.mark.parametrize("factors", [(2047 // 23, 23), (1373653 // 829, 829), (25326001 // 2251, 2251),
                                     (151, 751, 28351), (149491, 747451, 34233211), (2**32 - 5, 2**32 - 17)])
def test_is_prime_rejects_strong_pseudoprimes(factors):
    n = math.prod(factors)
    assert all(f > 1 for f in factors) and n > max(factors)  # composite by construction
    assert not is_prime(n)


@pytest.mark.parametrize("p", [p for p in range(3, 80) if prime_by_trial_division(p)])
def test_is_prime_agrees_with_lucas_lehmer_on_mersenne_numbers(p):
    assert is_prime(2**p - 1) == mersenne_prime_by_lucas_lehmer(p)


# --- the prime search behind head sizes ------------------------------------------

def test_prime_blocks_agree_with_trial_division_across_block_boundaries():
    blocks = PrimeBlocks()
    for start in (0, 1, BLOCK - 50, 3 * BLOCK - 7, 16000000):
        stream = blocks.primes_from(start)
        found = [next(stream) for _ in range(40)]
        assert found == [n for n in range(start, found[-1] + 1) if prime_by_trial_division(n)]


def test_head_sizes_follow_the_rule_where_orders_share_and_cross_vocab_sizes():
    # Orders with one vocab size share a stream; vocab 1 and 2 start at the smallest primes; the
    # 90-vocab order runs into primes the 100-vocab order took first.
    vocab_sizes, n_layers, n_heads = [100, 1, 100, 90, 2], 3, 7
    config = EngramConfig(layer_ids=tuple(range(n_layers)), num_embeddings=(0,) * n_layers,
                          max_ngram=len(vocab_sizes) + 1, n_heads=n_heads, head_dim=32,
                          vocab_sizes=tuple(vocab_sizes))
    assert head_sizes(config) == reference_head_sizes(vocab_sizes, n_layers, n_heads)
