"""read_checkpoint on real safetensors files: the plan it makes, and every refusal.

Checkpoints come from ``engramd.synth.writer`` or straight from the safetensors library,
small enough to write in milliseconds; damage is done by editing bytes on disk.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import time

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engram_client.core.errors import CheckpointError, LayoutError
from engram_client.core.layout import EngramConfig, build_layout
from engramd.loading.checkpoint import INDEX_NAME, read_checkpoint
from engramd.synth.writer import synth_config, write_checkpoint

VOCAB = 50
LAYERS = [1, 14]


def synth(path, **kwargs) -> str:
    directory = str(path)
    write_checkpoint(directory, **dict(dict(vocab_size=VOCAB, layer_ids=LAYERS, head_dim=64), **kwargs))
    return directory


def stem(layer: int) -> str:
    return f"layers.{layer}.engram.embed"


def load_all(path: str) -> dict[str, torch.Tensor]:
    with safe_open(path, framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def read_raw(path: str) -> tuple[dict, bytes]:
    """A safetensors file's header JSON and its data bytes."""
    with open(path, "rb") as f:
        blob = f.read()
    (length,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + length]), blob[8 + length:]


def write_raw(path: str, header: dict, data: bytes) -> None:
    """Write a file whose length field matches its (edited) header JSON."""
    body = json.dumps(header).encode()
    body += b" " * (-len(body) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(body)) + body + data)


def index_map(directory: str) -> dict[str, str]:
    with open(os.path.join(directory, INDEX_NAME)) as f:
        return json.load(f)["weight_map"]


def edit_index(directory: str, name: str, shard) -> None:
    path = os.path.join(directory, INDEX_NAME)
    with open(path) as f:
        index = json.load(f)
    index["weight_map"][name] = shard
    with open(path, "w") as f:
        json.dump(index, f)


def refusal(directory: str, error=CheckpointError) -> str:
    with pytest.raises(error) as info:
        read_checkpoint(directory)
    return str(info.value)


# --- the plan -------------------------------------------------------------------

@pytest.mark.parametrize("shards", [1, 2, 3, 4])
@pytest.mark.parametrize("prefix", ["model.", ""])
def test_plan_points_at_the_tensor_bytes(tmp_path, shards, prefix):
    directory = synth(tmp_path, shards=shards, prefix=prefix, head_dim=256 if shards == 3 else 64)
    plan = read_checkpoint(directory)
    with open(os.path.join(directory, "config.json")) as f:
        expected_layouts = build_layout(EngramConfig.from_dict(json.load(f)))
    assert plan.layouts == expected_layouts
    assert plan.directory == directory
    assert plan.config.layer_ids == tuple(LAYERS)

    if shards == 1:
        expected_files = {os.path.join(directory, "model.safetensors")}
    else:
        weight_map = index_map(directory)
        expected_files = {os.path.join(directory, weight_map[f"{prefix}{stem(layer)}.{part}"])
                          for layer in LAYERS for part in ("weight", "scale")}
    assert set(plan.files) == expected_files
    assert list(plan.files) == sorted(plan.files)

    seen_bytes = 0
    for layer in plan.layers:
        layout = layer.layout
        for source, part, cols in ((layer.weight, "weight", layout.head_dim), (layer.scale, "scale", layout.scale_cols)):
            assert source.name == f"{prefix}{stem(layout.layer)}.{part}"
            assert source.path in plan.files
            assert source.nbytes == layout.rows * cols
            with safe_open(source.path, framework="pt") as f:
                tensor = f.get_tensor(source.name)
            assert tuple(tensor.shape) == (layout.rows, cols)
            with open(source.path, "rb") as f:
                f.seek(source.offset)
                on_disk = f.read(source.nbytes)
            assert on_disk == tensor.view(torch.uint8).numpy().tobytes()
            seen_bytes += source.nbytes
    assert plan.source_bytes == seen_bytes


def test_unrelated_tensors_are_ignored(tmp_path):
    directory = synth(tmp_path)
    path = os.path.join(directory, "model.safetensors")
    tensors = load_all(path)
    # Tensors that look almost like Engram tables, in dtypes the reader would refuse.
    tensors["model.layers.7.engram.embed.weight"] = torch.zeros(3, 5, dtype=torch.int64)
    tensors["model.layers.1.engram.embed.bias"] = torch.zeros(2, dtype=torch.float32)
    tensors["lm_head.weight"] = torch.ones(4, 4, dtype=torch.float16)
    save_file(tensors, path)
    plan = read_checkpoint(directory)
    names = {source.name for layer in plan.layers for source in (layer.weight, layer.scale)}
    assert names == {f"model.{stem(layer)}.{part}" for layer in LAYERS for part in ("weight", "scale")}


# --- refusals: tensors -----------------------------------------------------------

@pytest.mark.parametrize("prefix", ["model.", ""])
def test_missing_tensor_names_file_and_tensor(tmp_path, prefix):
    directory = synth(tmp_path, prefix=prefix)
    path = os.path.join(directory, "model.safetensors")
    tensors = load_all(path)
    del tensors[f"{prefix}{stem(14)}.scale"]
    save_file(tensors, path)
    message = refusal(directory)
    assert path in message
    assert f"{stem(14)}.scale" in message


def test_tensor_missing_from_index_names_index_and_tensor(tmp_path):
    directory = synth(tmp_path, shards=2)
    path = os.path.join(directory, INDEX_NAME)
    with open(path) as f:
        index = json.load(f)
    del index["weight_map"][f"model.{stem(1)}.weight"]
    with open(path, "w") as f:
        json.dump(index, f)
    message = refusal(directory)
    assert INDEX_NAME in message and f"{stem(1)}.weight" in message


def test_index_pointing_at_wrong_shard_names_shard_and_tensor(tmp_path):
    directory = synth(tmp_path, shards=2)
    name = f"model.{stem(1)}.weight"
    weight_map = index_map(directory)
    other = next(shard for shard in set(weight_map.values()) if shard != weight_map[name])
    edit_index(directory, name, other)
    message = refusal(directory)
    assert os.path.join(directory, other) in message and name in message


@pytest.mark.parametrize("part, dtype, dtype_name", [("weight", torch.uint8, "U8"), ("weight", torch.bfloat16, "BF16"),
                                                     ("scale", torch.uint8, "U8"),
                                                     ("scale", torch.float8_e4m3fn, "F8_E4M3")])
def test_wrong_dtype_names_file_tensor_and_dtypes(tmp_path, part, dtype, dtype_name):
    directory = synth(tmp_path)
    path = os.path.join(directory, "model.safetensors")
    tensors = load_all(path)
    name = f"model.{stem(1)}.{part}"
    tensors[name] = torch.zeros(tuple(tensors[name].shape), dtype=dtype)
    save_file(tensors, path)
    message = refusal(directory)
    assert path in message and name in message
    assert dtype_name in message
    assert ("F8_E4M3" if part == "weight" else "F8_E8M0") in message


@pytest.mark.parametrize("reshape", [lambda t: t[:-1], lambda t: t[:, :-1], lambda t: t.reshape(-1),
                                     lambda t: t.reshape(t.shape[1], t.shape[0])])
def test_wrong_shape_names_file_tensor_and_shapes(tmp_path, reshape):
    directory = synth(tmp_path)
    path = os.path.join(directory, "model.safetensors")
    tensors = load_all(path)
    name = f"model.{stem(14)}.weight"
    expected = list(tensors[name].shape)
    tensors[name] = reshape(tensors[name].view(torch.uint8)).contiguous().view(torch.float8_e4m3fn)
    got = list(tensors[name].shape)
    save_file(tensors, path)
    message = refusal(directory)
    assert path in message and name in message
    assert str(got) in message and str(expected) in message


# --- refusals: damaged files -------------------------------------------------------

@pytest.mark.parametrize("excess", [1, 2**40, 2**64 - 9])
def test_header_length_beyond_file_names_file(tmp_path, excess):
    directory = synth(tmp_path)
    path = os.path.join(directory, "model.safetensors")
    size = os.path.getsize(path)
    length = min(size - 8 + excess, 2**64 - 1)
    with open(path, "r+b") as f:
        f.write(struct.pack("<Q", length))
    message = refusal(directory)
    assert path in message and str(length) in message


@pytest.mark.parametrize("size", [0, 5])
def test_file_too_short_for_length_field_names_file(tmp_path, size):
    directory = synth(tmp_path)
    path = os.path.join(directory, "model.safetensors")
    os.truncate(path, size)
    assert path in refusal(directory)


@pytest.mark.parametrize("garbage", [b"\x00", b"x", b"[", b"\xff"])
def test_header_not_json_names_file(tmp_path, garbage):
    directory = synth(tmp_path)
    path = os.path.join(directory, "model.safetensors")
    with open(path, "r+b") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        f.write(garbage * length)
    message = refusal(directory)
    assert path in message and "JSON" in message


def test_header_json_not_an_object_names_file(tmp_path):
    directory = synth(tmp_path)
    path = os.path.join(directory, "model.safetensors")
    _header, data = read_raw(path)
    write_raw(path, [1, 2, 3], data)
    assert path in refusal(directory)


def test_data_beyond_file_end_names_file_and_tensor(tmp_path):
    directory = synth(tmp_path)
    path = os.path.join(directory, "model.safetensors")
    header, _data = read_raw(path)
    data_start = os.path.getsize(path) - len(_data)
    engram = {name: entry for name, entry in header.items() if ".engram.embed." in name}
    last = max(engram, key=lambda name: engram[name]["data_offsets"][1])
    end = data_start + engram[last]["data_offsets"][1]
    os.truncate(path, end - 1)  # cuts the last byte of the last Engram tensor only
    message = refusal(directory)
    assert path in message and last in message
    assert str(end) in message and str(end - 1) in message


@pytest.mark.parametrize("offsets", ["shorter", "longer", "shifted_negative", "not_a_pair", "strings", "bools"])
def test_data_offsets_span_mismatch_names_file_and_tensor(tmp_path, offsets):
    directory = synth(tmp_path)
    path = os.path.join(directory, "model.safetensors")
    header, data = read_raw(path)
    name = f"model.{stem(1)}.scale"
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = {"shorter": [begin, end - 1], "longer": [begin, end + 1],
                                    "shifted_negative": [-1, end - begin - 1], "not_a_pair": [begin],
                                    "strings": [str(begin), str(end)], "bools": [False, True]}[offsets]
    write_raw(path, header, data)
    message = refusal(directory)
    assert path in message and name in message
    assert "data_offsets" in message


# --- refusals: the directory and its index ------------------------------------------

def test_index_mapping_to_missing_shard_is_refused(tmp_path):
    directory = synth(tmp_path, shards=2)
    absent = "model-00009-of-00009.safetensors"
    edit_index(directory, f"model.{stem(14)}.scale", absent)
    message = refusal(directory)
    assert os.path.join(directory, absent) in message


def test_index_mapping_to_missing_shard_names_the_tensor(tmp_path):
    directory = synth(tmp_path, shards=2)
    name = f"model.{stem(14)}.scale"
    edit_index(directory, name, "model-00009-of-00009.safetensors")
    assert name in refusal(directory)


@pytest.mark.parametrize("shard", ["sub/model-00001-of-00002.safetensors", "../model-00001-of-00002.safetensors",
                                   "/etc/passwd", 3, None])
def test_index_mapping_outside_directory_names_index_and_tensor(tmp_path, shard):
    directory = synth(tmp_path, shards=2)
    name = f"model.{stem(1)}.weight"
    edit_index(directory, name, shard)
    message = refusal(directory)
    assert os.path.join(directory, INDEX_NAME) in message and name in message


@pytest.mark.parametrize("content", ["{not json", "[]", '{"metadata": {}}', '{"weight_map": []}'])
def test_unusable_index_names_index(tmp_path, content):
    directory = synth(tmp_path, shards=2)
    with open(os.path.join(directory, INDEX_NAME), "w") as f:
        f.write(content)
    assert os.path.join(directory, INDEX_NAME) in refusal(directory)


def test_no_safetensors_file_is_refused(tmp_path):
    directory = synth(tmp_path)
    os.unlink(os.path.join(directory, "model.safetensors"))
    message = refusal(directory)
    assert directory in message and "found 0" in message


def test_two_safetensors_files_without_index_are_refused(tmp_path):
    directory = synth(tmp_path)
    shutil.copy(os.path.join(directory, "model.safetensors"), os.path.join(directory, "extra.safetensors"))
    message = refusal(directory)
    assert directory in message and "found 2" in message and INDEX_NAME in message


def test_missing_directory_and_config_are_refused(tmp_path):
    assert str(tmp_path / "absent") in refusal(str(tmp_path / "absent"))
    directory = synth(tmp_path / "ckpt")
    os.unlink(os.path.join(directory, "config.json"))
    assert os.path.join(directory, "config.json") in refusal(directory, LayoutError)


def test_config_vocab_disagreeing_with_num_embeddings_names_config(tmp_path):
    directory = synth(tmp_path)
    config_path = os.path.join(directory, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    stated = config["engram_num_embeddings"]
    config["engram_vocab_size"] = VOCAB + 40
    with open(config_path, "w") as f:
        json.dump(config, f)
    rows = synth_config(VOCAB + 40, LAYERS, 4, 8, 64)["engram_num_embeddings"]
    message = refusal(directory, LayoutError)
    assert config_path in message
    assert str(stated[0]) in message and str(rows[0]) in message


def test_config_disagreeing_with_tensor_shapes_names_file_and_tensor(tmp_path):
    directory = synth(tmp_path)
    config_path = os.path.join(directory, "config.json")
    with open(config_path) as f:
        old = json.load(f)
    new = synth_config(VOCAB + 40, LAYERS, 4, 8, 64)  # self-consistent, but not what the tensors hold
    assert new["engram_num_embeddings"] != old["engram_num_embeddings"]
    with open(config_path, "w") as f:
        json.dump(new, f)
    message = refusal(directory)
    path = os.path.join(directory, "model.safetensors")
    assert path in message and "engram.embed" in message
    assert "shape" in message and "config.json" in message


# --- fingerprint ------------------------------------------------------------------

def test_fingerprint_is_stable_for_unchanged_files(tmp_path):
    directory = synth(tmp_path, shards=2)
    first = read_checkpoint(directory).fingerprint
    (tmp_path / "README.md").write_text("notes\n")
    assert read_checkpoint(directory).fingerprint == first
    assert read_checkpoint(directory).fingerprint == first


def test_fingerprint_changes_when_a_file_is_rewritten(tmp_path):
    directory = synth(tmp_path, seed=0)
    path = os.path.join(directory, "model.safetensors")
    before, old_bytes = read_checkpoint(directory), open(path, "rb").read()
    time.sleep(0.05)  # file timestamps tick at most every few ms; a rewrite must land on a later one
    synth(tmp_path, seed=1)
    after = read_checkpoint(directory)
    assert open(path, "rb").read() != old_bytes
    assert after.layouts == before.layouts
    assert after.fingerprint != before.fingerprint


def test_fingerprint_follows_each_used_shard_only(tmp_path):
    directory = synth(tmp_path, shards=3)
    unused = os.path.join(directory, "model-extra.safetensors")  # a shard with no Engram tensor
    save_file({"lm_head.weight": torch.ones(4, 4, dtype=torch.bfloat16)}, unused)
    edit_index(directory, "lm_head.weight", os.path.basename(unused))
    plan = read_checkpoint(directory)
    assert unused not in plan.files and len(plan.files) == 3
    stat = os.stat(unused)
    os.utime(unused, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert read_checkpoint(directory).fingerprint == plan.fingerprint
    stat = os.stat(plan.files[-1])
    os.utime(plan.files[-1], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert read_checkpoint(directory).fingerprint != plan.fingerprint
