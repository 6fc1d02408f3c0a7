"""Reading an Engram checkpoint's layout from config.json and safetensors headers.

Owns everything about where a layer's tensors live on disk: the single-file and
sharded (``model.safetensors.index.json``) forms, header parsing and every check
that the bytes a load will copy are really there.  It reads headers only, never
tensor data, so ``engramd inspect`` works on a checkpoint far larger than RAM.

Tensors, with or without a ``model.`` prefix:
    layers.{L}.engram.embed.weight   F8_E4M3  [rows, head_dim]
    layers.{L}.engram.embed.scale    F8_E8M0  [rows, head_dim / 32]
Every other tensor is ignored.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass

from engram_client.core.errors import CheckpointError
from engram_client.core.layout import EngramConfig, LayerLayout, build_layout

INDEX_NAME = "model.safetensors.index.json"
# Real headers are a few MiB at most; a larger length field means a damaged file.
MAX_HEADER_BYTES = 256 * 1024 * 1024
DTYPE_BYTES = {"F8_E4M3": 1, "F8_E8M0": 1, "U8": 1, "I8": 1, "BOOL": 1, "F16": 2, "BF16": 2, "I16": 2,
               "U16": 2, "F32": 4, "I32": 4, "U32": 4, "F64": 8, "I64": 8, "U64": 8}


@dataclass(frozen=True)
class TensorSource:
    """Where one tensor's bytes are: ``nbytes`` from absolute ``offset`` in ``path``."""
    name: str
    path: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class LayerSource:
    layout: LayerLayout
    weight: TensorSource
    scale: TensorSource


@dataclass(frozen=True)
class CheckpointPlan:
    directory: str
    config: EngramConfig
    layers: tuple[LayerSource, ...]
    files: tuple[str, ...]
    fingerprint: str

    @property
    def layouts(self) -> list[LayerLayout]:
        return [layer.layout for layer in self.layers]

    @property
    def source_bytes(self) -> int:
        return sum(layer.weight.nbytes + layer.scale.nbytes for layer in self.layers)


@dataclass(frozen=True)
class _FileHeader:
    path: str
    size: int
    mtime_ns: int
    data_start: int
    entries: dict


def _read_file_header(path: str) -> _FileHeader:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            mtime_ns = os.fstat(f.fileno()).st_mtime_ns
            prefix = f.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header length)")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES or 8 + length > size:
                raise CheckpointError(f"{path}: header length {length} does not fit the {size}-byte file")
            blob = f.read(length)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror}") from exc
    except ValueError as exc:  # a name with a NUL or an unencodable character: never a file
        raise CheckpointError(f"{path!r}: not a usable file name: {exc}") from exc
    try:
        entries = json.loads(blob)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{path}: header is not valid JSON: {type(exc).__name__}: {exc}") from exc
    if not isinstance(entries, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    return _FileHeader(path, size, mtime_ns, 8 + length, entries)


def _tensor_files(directory: str) -> dict[str, str] | list[str]:
    """Either the index's tensor -> file map, or the one .safetensors file's path."""
    index_path = os.path.join(directory, INDEX_NAME)
    if os.path.exists(index_path):
        try:
            with open(index_path, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise CheckpointError(f"{index_path}: cannot read weight_map: {type(exc).__name__}: {exc}") from exc
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index_path}: weight_map is not an object")
        return weight_map
    singles = sorted(name for name in os.listdir(directory) if name.endswith(".safetensors"))
    if len(singles) != 1:
        raise CheckpointError(f"{directory}: expected {INDEX_NAME} or exactly one .safetensors file, "
                              f"found {len(singles)} .safetensors files")
    return [os.path.join(directory, singles[0])]


class _Finder:
    """Looks tensors up by name, opening each shard's header at most once."""

    def __init__(self, directory: str):
        self.directory = directory
        self.files = _tensor_files(directory)
        self.headers: dict[str, _FileHeader] = {}

    def header(self, path: str) -> _FileHeader:
        if path not in self.headers:
            self.headers[path] = _read_file_header(path)
        return self.headers[path]

    def find(self, bare_name: str) -> tuple[str, _FileHeader]:
        candidates = (bare_name, "model." + bare_name)
        if isinstance(self.files, dict):
            for name in candidates:
                if name in self.files:
                    shard = self.files[name]
                    if not isinstance(shard, str) or os.path.basename(shard) != shard:
                        raise CheckpointError(f"{self.directory}/{INDEX_NAME}: tensor {name} maps to {shard!r}, "
                                              "which is not a file name in the checkpoint directory")
                    try:
                        header = self.header(os.path.join(self.directory, shard))
                    except CheckpointError as exc:
                        raise CheckpointError(f"{exc} (index maps tensor {name} there)") from exc
                    if name not in header.entries:
                        raise CheckpointError(f"{header.path}: index says tensor {name} is here, but it is not")
                    return name, header
            where = f"{self.directory}/{INDEX_NAME}"
        else:
            header = self.header(self.files[0])
            for name in candidates:
                if name in header.entries:
                    return name, header
            where = header.path
        raise CheckpointError(f"{where}: missing tensor {bare_name} (also looked for model.{bare_name})")


def _locate(finder: _Finder, bare_name: str, dtype: str, shape: list[int]) -> tuple[TensorSource, _FileHeader]:
    name, header = finder.find(bare_name)
    entry = header.entries[name]
    where = f"{header.path}: tensor {name}"
    if not isinstance(entry, dict):
        raise CheckpointError(f"{where}: header entry is not an object")
    if entry.get("dtype") != dtype:
        raise CheckpointError(f"{where}: dtype {entry.get('dtype')}, expected {dtype}")
    if entry.get("shape") != shape:
        raise CheckpointError(f"{where}: shape {entry.get('shape')}, expected {shape} (from config.json)")
    offsets = entry.get("data_offsets")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        raise CheckpointError(f"{where}: data_offsets {offsets!r} is not a pair of integers")
    begin, end = offsets
    nbytes = shape[0] * shape[1] * DTYPE_BYTES[dtype]
    if begin < 0 or end - begin != nbytes:
        raise CheckpointError(f"{where}: data_offsets {offsets} span {end - begin} bytes, shape needs {nbytes}")
    if header.data_start + end > header.size:
        raise CheckpointError(f"{where}: data ends at byte {header.data_start + end} but the file has "
                              f"{header.size} bytes (truncated?)")
    return TensorSource(name, header.path, header.data_start + begin, nbytes), header


def read_checkpoint(directory: str) -> CheckpointPlan:
    """Validate a checkpoint from its config and headers; raise CheckpointError/LayoutError."""
    directory = os.path.abspath(directory)
    if not os.path.isdir(directory):
        raise CheckpointError(f"{directory}: checkpoint directory not found")
    config = EngramConfig.from_file(os.path.join(directory, "config.json"))
    layouts = build_layout(config)
    finder = _Finder(directory)
    digest = hashlib.sha256(json.dumps([layout.to_dict() for layout in layouts]).encode())
    layers, used = [], {}
    for layout in layouts:
        stem = f"layers.{layout.layer}.engram.embed"
        weight, wh = _locate(finder, stem + ".weight", "F8_E4M3", [layout.rows, layout.head_dim])
        scale, sh = _locate(finder, stem + ".scale", "F8_E8M0", [layout.rows, layout.scale_cols])
        layers.append(LayerSource(layout, weight, scale))
        for source, header in ((weight, wh), (scale, sh)):
            used[header.path] = header
            digest.update(json.dumps([source.name, os.path.basename(header.path), header.size, header.mtime_ns,
                                      source.offset, source.nbytes]).encode())
    return CheckpointPlan(directory, config, tuple(layers), tuple(sorted(used)), digest.hexdigest()[:32])
