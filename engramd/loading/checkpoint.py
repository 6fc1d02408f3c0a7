"""Reading an Engram checkpoint's layout from config.json and safetensors headers.

Owns everything about where a layer's tensors live on disk: the single-file and
sharded (``model.safetensors.index.json``) forms, header parsing and every check
that the bytes a load will copy are really there.  It reads headers only, never
tensor data, so ``engramd inspect`` works on a checkpoint far larger than RAM.  Every
file is opened through checkpoint_files.py: regular files under the checkpoint's root only.

The fingerprint names what a table was loaded from: the layout, and for each tensor its
name, its shard's name, size, mtime, inode and ctime, and where it lies.  A restart
re-adopts a table only if the fingerprint is unchanged, so a shard rewritten in place with
its mtime restored (``cp -p``, ``rsync -t``, ``touch -r``) still differs by ctime, which only
the kernel sets, and one replaced by another file by inode.  The device number is left
out: an overlay or a remount gives the same file another one.

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

from engram_client.core.errors import CheckpointError, LayoutError
from engram_client.core.layout import EngramConfig, LayerLayout, build_layout

from ..guards.checkpoint_files import MAX_JSON_BYTES, default_root, open_inside, read_inside

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
    root: str  # every file read lies under it (checkpoint_files.py)

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
    identity: tuple[int, int, int]  # mtime_ns, inode, ctime_ns: see the fingerprint above
    data_start: int
    entries: dict


def _read_file_header(path: str, root: str) -> _FileHeader:
    try:
        fd = open_inside(path, root)
    except ValueError as exc:  # a name with a NUL or an unencodable character: never a file
        raise CheckpointError(f"{path!r}: not a usable file name: {exc}") from exc
    try:
        with open(fd, "rb") as f:
            info = os.fstat(f.fileno())
            size = info.st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header length)")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES or 8 + length > size:
                raise CheckpointError(f"{path}: header length {length} does not fit the {size}-byte file")
            blob = f.read(length)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        entries = json.loads(blob)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{path}: header is not valid JSON: {type(exc).__name__}: {exc}") from exc
    if not isinstance(entries, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    return _FileHeader(path, size, (info.st_mtime_ns, info.st_ino, info.st_ctime_ns), 8 + length, entries)


def _read_json(path: str, root: str):
    return json.loads(read_inside(path, root, MAX_JSON_BYTES))


def read_config(directory: str, root: str) -> EngramConfig:
    """The checkpoint's config.json, read as every other checkpoint file is."""
    path = os.path.join(directory, "config.json")
    if not os.path.lexists(path):
        raise LayoutError(f"{path}: config.json not found")
    try:
        raw = _read_json(path, root)
    except CheckpointError as exc:
        raise LayoutError(str(exc)) from exc
    except (ValueError, RecursionError) as exc:
        raise LayoutError(f"{path}: cannot read config: {type(exc).__name__}: {exc}") from exc
    if not isinstance(raw, dict):
        raise LayoutError(f"{path}: config must be a JSON object")
    return EngramConfig.from_dict(raw, source=path)


def _tensor_files(directory: str, root: str) -> dict[str, str] | list[str]:
    """Either the index's tensor -> file map, or the one .safetensors file's path."""
    index_path = os.path.join(directory, INDEX_NAME)
    if os.path.lexists(index_path):
        try:
            weight_map = _read_json(index_path, root)["weight_map"]
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
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

    def __init__(self, directory: str, root: str):
        self.directory = directory
        self.root = root
        self.files = _tensor_files(directory, root)
        self.headers: dict[str, _FileHeader] = {}

    def header(self, path: str) -> _FileHeader:
        if path not in self.headers:
            self.headers[path] = _read_file_header(path, self.root)
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


def read_checkpoint(directory: str, root: str | None = None) -> CheckpointPlan:
    """Validate a checkpoint from its config and headers; raise CheckpointError/LayoutError.

    ``root``: what its files must lie under (default: as ``serve --checkpoint`` without
    --reload-root, the directory's parent)."""
    directory = os.path.abspath(directory)
    if not os.path.isdir(directory):
        raise CheckpointError(f"{directory}: checkpoint directory not found")
    root = root or default_root(directory)
    config = read_config(directory, root)
    layouts = build_layout(config)
    finder = _Finder(directory, root)
    digest = hashlib.sha256(json.dumps([layout.to_dict() for layout in layouts]).encode())
    layers, used = [], {}
    for layout in layouts:
        stem = f"layers.{layout.layer}.engram.embed"
        weight, wh = _locate(finder, stem + ".weight", "F8_E4M3", [layout.rows, layout.head_dim])
        scale, sh = _locate(finder, stem + ".scale", "F8_E8M0", [layout.rows, layout.scale_cols])
        layers.append(LayerSource(layout, weight, scale))
        for source, header in ((weight, wh), (scale, sh)):
            used[header.path] = header
            digest.update(json.dumps([source.name, os.path.basename(header.path), header.size, *header.identity,
                                      source.offset, source.nbytes]).encode())
    return CheckpointPlan(directory, config, tuple(layers), tuple(sorted(used)), digest.hexdigest()[:32], root)
