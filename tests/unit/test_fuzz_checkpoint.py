"""read_checkpoint on damaged real checkpoints, with hypothesis choosing the damage.

A small synth checkpoint (one file, and one of three shards with an index) is copied
and damaged: bytes flipped, inserted, deleted or overwritten in a safetensors file's
length field and header JSON, the file truncated anywhere, an Engram tensor's header
entry or a config.json / index value replaced with random JSON.  read_checkpoint must
either return a plan that points at bytes really in the file (the same bytes the
safetensors library reads, where it can read them) or raise CheckpointError or
LayoutError; any other exception is a bug.

Huge counts, deep nesting and unopenable shard names have targeted tests at the end; the
property tests keep out of those regions (see ``known_bug``), where an example can take
long enough to trip hypothesis's own limits, so that they keep guarding everything else.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import tempfile

import pytest
import torch
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st
from safetensors import safe_open

from engram_client.core.errors import CheckpointError, LayoutError
from engram_client.core.layout import CONFIG_FIELDS, EngramConfig, build_layout
from engramd.loading.checkpoint import INDEX_NAME, read_checkpoint
from engramd.synth.writer import write_checkpoint

FUZZ = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
DTYPES = {"F8_E4M3": torch.float8_e4m3fn, "F8_E8M0": torch.float8_e8m0fnu}
# Layout work (layers x orders x heads primes to find) above which read_checkpoint is
# known to run for minutes or exhaust memory: see test_huge_config_counts_are_refused_quickly.
MAX_LAYOUT_WORK = 4000


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz-ckpt")
    made = {}
    for name, shards in (("single", 1), ("sharded", 3)):
        write_checkpoint(str(base / name), vocab_size=50, layer_ids=[1, 14], head_dim=64, shards=shards, seed=3)
        made[name] = str(base / name)
    return made


# --- strategies -------------------------------------------------------------------

# Text that can name a file: no NUL, no lone surrogates (both are known bugs, pinned below).
safe_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
small_ints = st.one_of(st.integers(-3, 70), st.sampled_from([0, 1, 31, 32, 64, 96, 2586, 5668, 2**31, 2**63, -2**63]),
                       st.integers(-2**70, 2**70))
json_values = st.recursive(
    st.none() | st.booleans() | small_ints | st.floats(allow_nan=False) | safe_text,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(safe_text, children, max_size=4),
    max_leaves=10)


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def layout_work(raw) -> int:
    """How many head sizes build_layout would compute for this config.json content (0: it stops early)."""
    if not isinstance(raw, dict):
        return 0
    fields = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else None
    if fields is None or "engram_layer_ids" not in fields:
        fields = raw
    layers, max_ngram, heads = (fields.get(k) for k in ("engram_layer_ids", "engram_max_ngram_size", "engram_n_heads"))
    if not isinstance(layers, list) or _int(max_ngram) is None or _int(heads) is None:
        return 0
    return len(layers) * max(max_ngram - 1, 0) * max(heads, 0)


def known_bug(directory: str) -> str | None:
    """Why this damaged checkpoint falls in a region the targeted tests cover, or None."""
    try:
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return None
    fields = raw.get("text_config") if isinstance(raw, dict) and isinstance(raw.get("text_config"), dict) else raw
    for source in (raw, fields):
        if isinstance(source, dict) and (abs(_int(source.get("engram_max_ngram_size")) or 0) > 10**4
                                         or abs(_int(source.get("engram_n_heads")) or 0) > 10**4):
            return "huge engram_max_ngram_size / engram_n_heads"
    if layout_work(raw) > MAX_LAYOUT_WORK:
        return "huge layout work"
    return None


def header_region(path: str) -> int:
    """Bytes of a safetensors file's length field and header JSON (as its length field says)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
    return 8 + length


def rewrite_header(path: str, edit) -> None:
    """Apply ``edit`` to the parsed header JSON and write it back with a matching length field."""
    with open(path, "rb") as f:
        blob = f.read()
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + length])
    edit(header)
    body = json.dumps(header).encode()
    body += b" " * (-len(body) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(body)) + body + blob[8 + length:])


def damage(data, directory: str) -> str:
    """Damage one file of the copied checkpoint in ``directory``; returns a description."""
    shards = sorted(name for name in os.listdir(directory) if name.endswith(".safetensors"))
    targets = ["config.json"] + shards + ([INDEX_NAME] if os.path.exists(os.path.join(directory, INDEX_NAME)) else [])
    kind = data.draw(st.sampled_from(["flip", "insert", "delete", "overwrite", "truncate", "entry", "config",
                                      "config_bytes", "index"]), label="kind")
    if kind == "index" and INDEX_NAME not in targets:
        kind = "config"
    if kind in ("config", "config_bytes"):
        name = "config.json"
    elif kind == "index":
        name = INDEX_NAME
    else:
        name = data.draw(st.sampled_from(shards), label="shard")
    path = os.path.join(directory, name)
    with open(path, "rb") as f:
        blob = bytearray(f.read())

    if kind in ("flip", "insert", "delete", "overwrite"):
        region = min(len(blob), header_region(path))
        for _ in range(data.draw(st.integers(1, 4), label="edits")):
            pos = data.draw(st.integers(0, max(0, region - 1)), label="pos")
            if kind == "flip":
                blob[pos] ^= data.draw(st.integers(1, 255), label="xor")
            elif kind == "insert":
                blob[pos:pos] = data.draw(st.binary(min_size=1, max_size=32), label="inserted")
            elif kind == "delete":
                del blob[pos:pos + data.draw(st.integers(1, 32), label="deleted")]
            else:
                chunk = data.draw(st.binary(min_size=1, max_size=16) | st.sampled_from(
                    [b"9999999", b"-1", b"null", b"[]", b"{}", b'"', b"\\u0000", b"1e999", b"F8_E5M2"]), label="over")
                blob[pos:pos + len(chunk)] = chunk
        with open(path, "wb") as f:
            f.write(bytes(blob))
    elif kind == "truncate":
        os.truncate(path, data.draw(st.integers(0, len(blob) - 1), label="size"))
    elif kind == "entry":
        engram = [key for key in json.loads(blob[8:header_region(path)]) if ".engram.embed." in key]
        tensor = data.draw(st.sampled_from(engram), label="tensor")
        field = data.draw(st.sampled_from(["dtype", "shape", "data_offsets", "<entry>", "<delete>"]), label="field")
        value = data.draw(json_values | st.sampled_from(["F8_E4M3", "F8_E8M0", "U8", [0, 1], [2586, 64]]), label="value")

        def edit(header):
            if field == "<delete>":
                del header[tensor]
            elif field == "<entry>":
                header[tensor] = value
            else:
                header[tensor][field] = value
        rewrite_header(path, edit)
        name += f" [{tensor}].{field} = {value!r}"
    elif kind == "config":
        config = json.loads(blob)
        key = data.draw(st.sampled_from(list(CONFIG_FIELDS) + ["text_config", "other"]), label="key")
        if data.draw(st.booleans(), label="delete"):
            config.pop(key, None)
        else:
            config[key] = data.draw(json_values, label="value")
        with open(path, "w") as f:
            json.dump(config, f)
    elif kind == "config_bytes":
        pos = data.draw(st.integers(0, len(blob) - 1), label="pos")
        blob[pos] ^= data.draw(st.integers(1, 255), label="xor")
        with open(path, "wb") as f:
            f.write(bytes(blob))
    else:  # index: one weight_map value, or the map itself
        index = json.loads(blob)
        if data.draw(st.booleans(), label="whole"):
            index[data.draw(st.sampled_from(["weight_map", "metadata"]), label="key")] = data.draw(json_values)
        else:
            tensor = data.draw(st.sampled_from(sorted(index["weight_map"])), label="tensor")
            index["weight_map"][tensor] = data.draw(json_values | st.sampled_from(shards + ["..", "", "/etc/passwd"]),
                                                    label="shard")
        with open(path, "w") as f:
            json.dump(index, f)
    return f"{kind} {name}"


def check_plan(plan, directory: str) -> None:
    """A plan read_checkpoint accepted must point at bytes that are really there."""
    config = EngramConfig.from_file(os.path.join(directory, "config.json"))
    assert plan.layouts == build_layout(config)
    assert plan.directory == directory
    assert list(plan.files) == sorted(set(plan.files))
    for layer in plan.layers:
        layout = layer.layout
        for source, cols, dtype in ((layer.weight, layout.head_dim, "F8_E4M3"),
                                    (layer.scale, layout.scale_cols, "F8_E8M0")):
            assert source.path in plan.files and os.path.dirname(source.path) == directory
            assert source.nbytes == layout.rows * cols
            size = os.path.getsize(source.path)
            assert 8 <= source.offset and source.offset + source.nbytes <= size, (source, size)
            try:
                with safe_open(source.path, framework="pt") as f:
                    tensor = f.get_tensor(source.name)
            except Exception as exc:  # the library refuses some files read_checkpoint rightly accepts
                note(f"safetensors refuses {source.path}: {exc}")
                continue
            assert tensor.dtype == DTYPES[dtype] and tuple(tensor.shape) == (layout.rows, cols)
            with open(source.path, "rb") as f:
                f.seek(source.offset)
                assert f.read(source.nbytes) == tensor.view(torch.uint8).numpy().tobytes(), source.name


def copy_of(template: str, base: str) -> str:
    directory = tempfile.mkdtemp(dir=base)
    for name in os.listdir(template):
        shutil.copyfile(os.path.join(template, name), os.path.join(directory, name))
    return directory


# --- properties ---------------------------------------------------------------------

@FUZZ
@given(data=st.data())
def test_damaged_checkpoint_is_planned_consistently_or_refused(templates, tmp_path_factory, data):
    base = str(tmp_path_factory.getbasetemp())
    directory = copy_of(templates[data.draw(st.sampled_from(sorted(templates)), label="template")], base)
    try:
        note(damage(data, directory))
        assume(known_bug(directory) is None)
        try:
            plan = read_checkpoint(directory)
        except (CheckpointError, LayoutError) as exc:
            assert str(exc), "a refusal must say why"
            return
        check_plan(plan, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@settings(FUZZ, max_examples=4)
@given(data=st.data())
def test_undamaged_copy_is_planned(templates, tmp_path_factory, data):
    """The baseline the damage is measured against: each template reads cleanly."""
    directory = copy_of(templates[data.draw(st.sampled_from(sorted(templates)))], str(tmp_path_factory.getbasetemp()))
    try:
        check_plan(read_checkpoint(directory), directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)



# --- known bugs, pinned -------------------------------------------------------------

class Hung(Exception):
    pass


def refused_within(directory: str, seconds: float) -> None:
    """read_checkpoint must refuse (CheckpointError/LayoutError) within ``seconds``."""
    def on_alarm(_signum, _frame):
        raise Hung(f"read_checkpoint still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        with pytest.raises((CheckpointError, LayoutError)):
            read_checkpoint(directory)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def edit_config(directory: str, **values) -> None:
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(values)
    with open(path, "w") as f:
        json.dump(config, f)


@pytest.mark.parametrize("values", [{"engram_max_ngram_size": 10**20}, {"engram_max_ngram_size": 2**45},
                                    {"engram_max_ngram_size": 10**7}, {"engram_n_heads": 10**6}],
                         ids=["ngram-1e20-OverflowError", "ngram-2^45-MemoryError", "ngram-1e7-hangs",
                              "heads-1e6-hangs"])
def test_huge_config_counts_are_refused_quickly(templates, tmp_path, values):
    directory = copy_of(templates["single"], str(tmp_path))
    edit_config(directory, **values)
    refused_within(directory, 2.0)


@pytest.mark.parametrize("where", ["safetensors-header", "config.json", "index"])
def test_deeply_nested_json_is_refused(templates, tmp_path, where):
    directory = copy_of(templates["sharded" if where == "index" else "single"], str(tmp_path))
    deep = b"[" * 100_000
    if where == "safetensors-header":
        with open(os.path.join(directory, "model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(deep)) + deep)
    else:
        with open(os.path.join(directory, "config.json" if where == "config.json" else INDEX_NAME), "wb") as f:
            f.write(deep)
    refused_within(directory, 5.0)


@pytest.mark.parametrize("shard", ["model\x00.safetensors", "\ud800.safetensors"], ids=["nul", "surrogate"])
def test_unopenable_shard_name_in_index_is_refused(templates, tmp_path, shard):
    directory = copy_of(templates["sharded"], str(tmp_path))
    path = os.path.join(directory, INDEX_NAME)
    with open(path) as f:
        index = json.load(f)
    index["weight_map"]["model.layers.1.engram.embed.weight"] = shard
    with open(path, "w") as f:
        json.dump(index, f)
    refused_within(directory, 5.0)
