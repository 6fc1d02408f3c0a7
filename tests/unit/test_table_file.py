"""The table file: header plan and codec, the shm dir's files and locks, and the copy.

Everything lives in pytest's tmp_path, never /dev/shm.  Headers are also built by
hand from the byte layout drawn in ``table_file``'s docstring, so the codec is held
to the document rather than to itself.
"""
from __future__ import annotations

import gc
import json
import os
import re
import struct

import numpy as np
import pytest
import torch
from safetensors import safe_open

from engram_client.core.errors import CheckpointError, ShmSpaceError, TableFileError
from engram_client.core.layout import EngramConfig, LayerLayout, build_layout
from engram_client.core.table_file import (ALIGN, FORMAT_VERSION, HEADER_BYTES, MAGIC, STATE_COMPLETE, STATE_WRITING,
                                      TableHeader, read_header)
from engramd.loading import loader
from engramd.loading.checkpoint import read_checkpoint
from engramd.loading.loader import CheckpointSource, Progress, fill_table
from engramd.synth.writer import synth_config, write_checkpoint
from engramd.shm.table_files import ShmDir, instance_id

MIB2 = 2 * 1024 * 1024
FIXED = struct.Struct("<8sIIIIQ")  # the docstring's offsets 0, 8, 12, 16, 20, 24; JSON from 32
V41 = {"engram_vocab_size": 16000000, "engram_layer_ids": [1, 14], "engram_max_ngram_size": 4,
       "engram_n_heads": 8, "engram_head_dim": 256, "engram_num_embeddings": [384006168, 384016682]}


def small_layouts(vocab=50, layer_ids=(1, 14), head_dim=64) -> list[LayerLayout]:
    return build_layout(EngramConfig.from_dict(synth_config(vocab, list(layer_ids), 4, 8, head_dim)))


def small_header(generation=1, **kwargs) -> TableHeader:
    return TableHeader.plan(small_layouts(**kwargs), "f" * 32, "/ckpt", generation)


def raw_header(body, major=FORMAT_VERSION[0], minor=FORMAT_VERSION[1], state=STATE_COMPLETE, magic=MAGIC,
               length=None) -> bytes:
    """A header block of HEADER_BYTES built by hand, as a file's first 2 MiB would be."""
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    blob = FIXED.pack(magic, major, minor, state, 0, len(body) if length is None else length) + body
    return blob + bytes(HEADER_BYTES - len(blob))


def decode_error(blob: bytes) -> str:
    with pytest.raises(TableFileError) as info:
        TableHeader.decode(blob, "where.table")
    assert "where.table" in str(info.value)
    return str(info.value)


# --- plan -------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["small", "three", "v41"])
def test_plan_aligns_layers_without_overlap(which):
    layouts = {"small": small_layouts, "three": lambda: small_layouts(head_dim=256, layer_ids=(0, 3, 7)),
               "v41": lambda: build_layout(EngramConfig.from_dict(V41))}[which]()
    header = TableHeader.plan(layouts, "fp", "/ckpt", 3)
    assert [entry.layout for entry in header.layers] == layouts
    end = HEADER_BYTES
    for entry in header.layers:
        assert entry.offset % MIB2 == 0
        assert entry.offset >= end  # after the header and the previous layer
        assert entry.offset - end < MIB2  # and no further than the next boundary
        assert entry.nbytes == entry.layout.rows * (entry.layout.head_dim + entry.layout.head_dim // 32)
        end = entry.offset + entry.nbytes
    assert header.total_bytes % MIB2 == 0
    assert end <= header.total_bytes < end + MIB2
    assert header.layer(layouts[-1].layer).layout == layouts[-1]
    with pytest.raises(KeyError):
        header.layer(999)


def test_v41_table_size_follows_published_rows():
    header = TableHeader.plan(build_layout(EngramConfig.from_dict(V41)), "fp", "/ckpt", 1)
    rows = V41["engram_num_embeddings"]
    first_end = header.layers[0].offset + rows[0] * 264
    assert header.layers[1].offset == -(-first_end // MIB2) * MIB2
    assert header.total_bytes == -(-(header.layers[1].offset + rows[1] * 264) // MIB2) * MIB2


# --- encode / decode ----------------------------------------------------------------

@pytest.mark.parametrize("state", [STATE_WRITING, STATE_COMPLETE])
def test_encode_decode_round_trip(state):
    header = small_header(generation=7)
    blob = header.encode(state)
    magic, major, minor, got_state, _reserved, length = FIXED.unpack_from(blob)
    assert (magic, (major, minor), got_state) == (MAGIC, FORMAT_VERSION, state)
    assert json.loads(blob[FIXED.size:FIXED.size + length]) == header.to_json()
    padded = blob + bytes(HEADER_BYTES - len(blob))
    assert TableHeader.decode(padded, "t") == (header, state)
    assert TableHeader.decode(blob, "t") == (header, state)


def test_newer_minor_version_is_read():
    header = small_header()
    assert TableHeader.decode(raw_header(header.to_json(), minor=FORMAT_VERSION[1] + 5), "t") == \
        (header, STATE_COMPLETE)


def test_decode_rejects_wrong_magic():
    message = decode_error(raw_header(small_header().to_json(), magic=b"SAFETENS"))
    assert "SAFETENS" in message


@pytest.mark.parametrize("major", [0, FORMAT_VERSION[0] + 1, 2**32 - 1])
def test_decode_rejects_other_major_version(major):
    assert str(major) in decode_error(raw_header(small_header().to_json(), major=major))


@pytest.mark.parametrize("excess", [1, 2**20, 2**63])
def test_decode_rejects_json_length_overrunning_header(excess):
    length = HEADER_BYTES - FIXED.size + excess
    assert str(length) in decode_error(raw_header(small_header().to_json(), length=length))


def test_decode_rejects_json_length_overrunning_short_blob():
    body = json.dumps(small_header().to_json()).encode()
    blob = FIXED.pack(MAGIC, *FORMAT_VERSION, STATE_COMPLETE, 0, len(body) + 1) + body
    decode_error(blob)


def test_decode_rejects_blob_shorter_than_fixed_part():
    decode_error(small_header().encode(STATE_COMPLETE)[:FIXED.size - 1])


def _damaged_bodies():
    good = small_header().to_json()
    yield "garbage", b"x" + json.dumps(good).encode()[1:]
    yield "not utf-8", b"\xff" * 40
    yield "truncated", json.dumps(good).encode()[:-1]
    for key in ("layers", "fingerprint", "generation", "total_bytes"):
        yield f"no {key}", {k: v for k, v in good.items() if k != key}
    yield "layer without offset", dict(good, layers=[{k: v for k, v in good["layers"][0].items() if k != "offset"}])
    yield "head_sizes not ints", dict(good, layers=[dict(good["layers"][0], head_sizes=["a"])])
    yield "layers not a list", dict(good, layers=7)
    yield "a list", [good]


@pytest.mark.parametrize("body", [body for _name, body in _damaged_bodies()],
                         ids=[name for name, _body in _damaged_bodies()])
def test_decode_rejects_damaged_json(body):
    assert "damaged header JSON" in decode_error(raw_header(body))


@pytest.mark.parametrize("change", ["offset_past_total", "total_too_small", "unaligned", "inside_header"])
def test_decode_rejects_layer_outside_table(change):
    good = small_header().to_json()
    last = dict(good["layers"][-1])
    layers = good["layers"][:-1]
    total = good["total_bytes"]
    if change == "offset_past_total":
        last["offset"] = total
    elif change == "total_too_small":
        total = last["offset"]
    elif change == "unaligned":
        last["offset"] += 4096
    else:
        last["offset"] = 0
    message = decode_error(raw_header(dict(good, layers=layers + [last], total_bytes=total)))
    assert f"layer {last['layer']}" in message and str(last["offset"]) in message


# --- read_header ------------------------------------------------------------------------

def write_table(path, header: TableHeader, state: int, size: int | None = None) -> str:
    with open(path, "wb") as f:
        f.write(header.encode(state))
        f.truncate(header.total_bytes if size is None else size)
    return str(path)


def test_read_header_refuses_incomplete_table(tmp_path):
    header = small_header()
    path = write_table(tmp_path / "t.table", header, STATE_WRITING)
    with pytest.raises(TableFileError) as info:
        read_header(path)
    assert path in str(info.value) and "not complete" in str(info.value)
    assert read_header(path, require_complete=False) == (header, STATE_WRITING)


def test_read_header_accepts_complete_table(tmp_path):
    header = small_header()
    path = write_table(tmp_path / "t.table", header, STATE_COMPLETE)
    assert read_header(path) == (header, STATE_COMPLETE)


@pytest.mark.parametrize("size", [0, HEADER_BYTES - 1, HEADER_BYTES, "total-1"])
def test_read_header_refuses_short_file(tmp_path, size):
    header = small_header()
    size = header.total_bytes - 1 if size == "total-1" else size
    path = write_table(tmp_path / "t.table", header, STATE_COMPLETE, size=size)
    with pytest.raises(TableFileError, match=re.escape(path)):
        read_header(path)


def test_read_header_of_missing_file(tmp_path):
    with pytest.raises(TableFileError, match="cannot read"):
        read_header(str(tmp_path / "absent.table"))


# --- ShmDir ---------------------------------------------------------------------------------

@pytest.fixture
def shm(tmp_path):
    directory = ShmDir(str(tmp_path), instance_id("ipc:///tmp/engramd-test.sock"))
    yield directory
    directory.close()


def test_instance_id_is_stable_hex():
    assert instance_id("ipc:///a") == instance_id("ipc:///a")
    assert instance_id("ipc:///a") != instance_id("ipc:///b")
    assert re.fullmatch(r"[0-9a-f]{12}", instance_id("ipc:///a"))


def test_create_writes_partial_until_publish(shm):
    header = small_header(generation=4)
    writer = shm.create(header)
    final = shm.table_path(4)
    assert writer.final_path == final and writer.partial_path == final + ".partial"
    assert os.path.exists(writer.partial_path) and not os.path.exists(final)
    assert os.path.getsize(writer.partial_path) == header.total_bytes
    assert os.stat(writer.partial_path).st_mode & 0o777 == 0o600
    assert read_header(writer.partial_path, require_complete=False) == (header, STATE_WRITING)
    with pytest.raises(TableFileError, match="not complete"):
        read_header(writer.partial_path)
    assert writer.publish() == final
    assert os.path.exists(final) and not os.path.exists(final + ".partial")
    assert read_header(final) == (header, STATE_COMPLETE)


def test_abandon_removes_partial(shm, tmp_path):
    writer = shm.create(small_header(generation=2))
    writer.abandon()
    assert not os.path.exists(writer.partial_path)
    assert not os.path.exists(writer.final_path)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith((".table", ".partial"))] == []
    writer.abandon()  # twice is harmless


def test_check_space_refuses_more_than_free(shm, tmp_path):
    shm.check_space(MIB2)
    nbytes = 1 << 60
    with pytest.raises(ShmSpaceError) as info:
        shm.check_space(nbytes)
    message = str(info.value)
    stat = os.statvfs(tmp_path)
    free_gib = stat.f_bavail * stat.f_frsize / 2**30
    stated_free = float(re.search(r"has ([0-9.]+) GiB free", message).group(1))
    assert abs(stated_free - free_gib) < 0.1
    assert f"{nbytes / 2**30:.2f} GiB" in message and f"{nbytes} bytes" in message
    assert str(tmp_path) in message
    suggested = int(re.search(r"--shm-size=(\d+)g", message).group(1))
    assert suggested * 2**30 >= 2 * nbytes, "the advice leaves room for a reload's second generation"


def test_create_refuses_table_larger_than_free_space(shm, tmp_path):
    huge = TableHeader((), "fp", "/ckpt", 9, 1 << 60)
    with pytest.raises(ShmSpaceError, match="--shm-size"):
        shm.create(huge)
    assert not any(p.name.startswith(f"engramd-{shm.instance}-g9") for p in tmp_path.iterdir())


def test_second_owner_of_an_instance_is_refused(tmp_path):
    inst = instance_id("ipc:///tmp/one")
    first = ShmDir(str(tmp_path), inst)
    try:
        assert open(first.lock_path).read() == f"{os.getpid()}\n"
        with pytest.raises(TableFileError) as info:
            ShmDir(str(tmp_path), inst)
        assert first.lock_path in str(info.value)
        other = ShmDir(str(tmp_path), instance_id("ipc:///tmp/two"))  # another instance is independent
        other.close()
    finally:
        first.close()
    again = ShmDir(str(tmp_path), inst)
    again.close()
    assert not os.path.exists(again.lock_path)


def test_shm_dir_must_exist(tmp_path):
    with pytest.raises(TableFileError, match="does not exist"):
        ShmDir(str(tmp_path / "absent"), instance_id("x"))


def test_remove_orphans_spares_live_owners_and_other_files(tmp_path):
    me, live, dead, lockless = (instance_id(f"ipc:///tmp/{name}") for name in ("me", "live", "dead", "lockless"))
    live_dir = ShmDir(str(tmp_path), live)
    (tmp_path / f"engramd-{dead}.lock").write_text("12345\n")  # left by a daemon that died: lock free
    orphans = [f"engramd-{dead}-g1.table", f"engramd-{dead}-g2.table.partial", f"engramd-{lockless}-g3.table",
               f"engramd-{me}-g2.table.partial"]  # my own unfinished one, left by my previous run
    kept = [f"engramd-{live}-g5.table", f"engramd-{live}-g6.table.partial", f"engramd-{dead}-g1.table.bak",
            f"engramd-{dead}.lock", "engramd-notes.txt", "engramd-XYZXYZXYZXYZ-g1.table", "other.table",
            f"engramd-{dead}-gx.table",
            f"engramd-{me}-g1.table"]  # my own complete one: kept for re-adoption
    for name in orphans + kept:
        if not (tmp_path / name).exists():
            (tmp_path / name).write_bytes(b"x")
    mine = ShmDir(str(tmp_path), me)
    try:
        removed = mine.remove_orphans()
        assert sorted(removed) == sorted(str(tmp_path / name) for name in orphans)
        assert not any((tmp_path / name).exists() for name in orphans)
        assert all((tmp_path / name).exists() for name in kept)
        assert os.path.exists(live_dir.lock_path) and os.path.exists(mine.lock_path)
        assert mine.own_tables() == [(1, str(tmp_path / f"engramd-{me}-g1.table"))]
        with pytest.raises(TableFileError, match="refusing to unlink"):
            mine.unlink(str(tmp_path / "other.table"))

        live_dir.close()  # its owner is gone now: its tables are orphans too
        removed = mine.remove_orphans()
        assert sorted(removed) == sorted(str(tmp_path / name) for name in kept[:2])
    finally:
        live_dir.close()
        mine.close()


def test_in_a_shared_shm_dir_the_lock_lives_in_the_daemons_own_directory(tmp_path):
    """Anyone could plant engramd-<id>.lock in /dev/shm (the name is the endpoint's hash) and keep
    the daemon from starting; in its own directory nobody else can, and a second owner is still refused."""
    os.chmod(tmp_path, 0o1777)
    inst, other = instance_id("ipc:///tmp/one"), instance_id("ipc:///tmp/two")
    planted = tmp_path / f"engramd-{inst}.lock"
    planted.symlink_to(tmp_path / "victim")
    first = ShmDir(str(tmp_path), inst)
    try:
        assert os.path.dirname(first.lock_path) == first.files_dir != str(tmp_path)
        with pytest.raises(TableFileError, match="another live engramd"):
            ShmDir(str(tmp_path), inst)
        neighbour = ShmDir(str(tmp_path), other)  # another instance judges first's files by first's lock
        live = first.table_path(3)
        open(live, "wb").close()
        assert neighbour.remove_orphans() == [] and os.path.exists(live)
        first.close()
        assert neighbour.remove_orphans() == [live]
        neighbour.close()
    finally:
        first.close()
    assert os.path.islink(planted) and not (tmp_path / "victim").exists()
    assert sorted(os.listdir(tmp_path)) == [planted.name], "a directory or lock was left after the stop"


# --- fill_table -------------------------------------------------------------------------

def packed_rows(path: str, offset: int, layout: LayerLayout) -> np.ndarray:
    with open(path, "rb") as f:
        f.seek(offset)
        blob = f.read(layout.rows * layout.row_bytes)
    return np.frombuffer(blob, dtype=np.uint8).reshape(layout.rows, layout.row_bytes)


def tensor_bytes(path: str, name: str) -> np.ndarray:
    with safe_open(path, framework="pt") as f:
        return f.get_tensor(name).view(torch.uint8).numpy()


@pytest.mark.parametrize("shards, prefix, head_dim, chunk", [(1, "model.", 256, None), (3, "", 64, 1000),
                                                             (4, "model.", 64, 64 * 7)])
def test_fill_table_copies_checkpoint_exactly(tmp_path, monkeypatch, shards, prefix, head_dim, chunk):
    if chunk is not None:  # many chunks, boundaries not on row multiples of anything in particular
        monkeypatch.setattr(loader, "CHUNK_BYTES", chunk)
    ckpt = tmp_path / "ckpt"
    write_checkpoint(str(ckpt), vocab_size=50, layer_ids=[1, 14], head_dim=head_dim, shards=shards,
                     prefix=prefix, seed=3)
    plan = read_checkpoint(str(ckpt))
    (tmp_path / "shm").mkdir()
    shm = ShmDir(str(tmp_path / "shm"), instance_id("ipc:///tmp/fill"))
    try:
        header = TableHeader.plan(plan.layouts, plan.fingerprint, plan.directory, 1)
        writer = shm.create(header)
        source = CheckpointSource(plan)
        progress = Progress()
        try:
            fill_table(writer, source, progress, threads=4)
        finally:
            source.close()
        assert progress.snapshot() == {"done_bytes": plan.source_bytes, "total_bytes": plan.source_bytes}
        path = writer.publish()
        assert read_header(path)[0] == header
        for entry, layer in zip(header.layers, plan.layers):
            layout = entry.layout
            rows = packed_rows(path, entry.offset, layout)
            weight = tensor_bytes(layer.weight.path, layer.weight.name)
            scale = tensor_bytes(layer.scale.path, layer.scale.name)
            assert weight.shape == (layout.rows, layout.head_dim) and scale.shape == (layout.rows, layout.scale_cols)
            assert np.array_equal(rows[:, :layout.head_dim], weight)
            assert np.array_equal(rows[:, layout.head_dim:], scale)
            with open(path, "rb") as f:  # the padding up to the next boundary stays zero
                f.seek(entry.offset + entry.nbytes)
                pad = f.read(-(-(entry.offset + entry.nbytes) // ALIGN) * ALIGN - entry.offset - entry.nbytes)
            assert pad == bytes(len(pad))
    finally:
        shm.close()


@pytest.fixture
def truncated_load(tmp_path):
    """A writer and a source whose checkpoint lost its last bytes after inspection."""
    ckpt = tmp_path / "ckpt"
    write_checkpoint(str(ckpt), vocab_size=50, layer_ids=[1, 14], head_dim=64)
    plan = read_checkpoint(str(ckpt))
    victim = plan.layers[-1].weight
    os.truncate(victim.path, victim.offset + victim.nbytes // 2)
    (tmp_path / "shm").mkdir()
    shm = ShmDir(str(tmp_path / "shm"), instance_id("ipc:///tmp/trunc"))
    writer = shm.create(TableHeader.plan(plan.layouts, plan.fingerprint, plan.directory, 1))
    source = CheckpointSource(plan)
    yield writer, source, victim
    source.close()
    writer.abandon()
    shm.close()


def test_fill_table_reports_checkpoint_truncated_after_inspection(truncated_load):
    writer, source, victim = truncated_load
    with pytest.raises(CheckpointError) as info:
        fill_table(writer, source, Progress(), threads=2)
    assert victim.path in str(info.value) and victim.name in str(info.value)


def test_abandon_right_after_a_failed_fill_removes_partial(truncated_load):
    writer, source, _victim = truncated_load
    gc.disable()  # the daemon's cleanup runs before any collection; make that deterministic here
    try:
        try:
            fill_table(writer, source, Progress(), threads=2)
        except CheckpointError:
            pass  # dropped, as daemon._load does once it has recorded the message
        writer.abandon()
    finally:
        gc.enable()
    assert not os.path.exists(writer.partial_path)
