"""The table file in the shm dir: its header, its layout, and how to read the header.

    offset 0          magic  b"ENGRAMTB"                      8 bytes
    offset 8          format major, minor                      2 x u32 LE
    offset 16         state  (0 writing, 1 complete)           u32 LE
    offset 20         reserved                                 u32
    offset 24         JSON length N                            u64 LE
    offset 32         JSON (utf-8, N bytes): layers, fingerprint, checkpoint, generation,
                      hashing (null, or the token hash's facts: hashing_section.py)
    offset 2 MiB      [format 2: only with hashing] token map, int32 LE per token id,
                      then zero padding to a 2 MiB boundary
    next 2 MiB        layer 0 rows, then zero padding to a 2 MiB boundary
    ...               layer 1 rows, ...

Rows are *packed*: each row is its ``head_dim`` FP8-E4M3 bytes followed by its
``head_dim/32`` UE8M0 scale bytes (264 B for V4.1).  A random-row lookup through
UVA is bound by address translation, not bytes: storing weight and scale apart
costs a second translation miss per row (measured on an H200: 393,216 random rows
took 22 ms separate vs 14 ms packed), so a row's bytes stay together.  Layers start
on 2 MiB boundaries so each layer can be registered, mapped and backed by huge
pages on its own.

The writer fills a file named ``*.partial`` with state 0 and renames it to its
final name only after the data is flushed and the state is set to 1: a client that
finds a file by its final name, or is handed one by the daemon, only ever sees a
complete table, and checks the state byte anyway.

The format version moves apart from the packages and the wire protocol.  Format 2
added the hashing section; a reader of format 1 refuses a format-2 file by its major.
The fingerprint is the daemon's digest of what a table was loaded from (engramd's
checkpoint.py); readers only compare it for equality, so what goes into it may change
without a format version: a table made under an older rule is reloaded, never re-adopted.
"""
from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

from .errors import TableFileError
from .hashing_section import HashingSection
from .layout import LayerLayout

MAGIC = b"ENGRAMTB"
FORMAT_VERSION = (2, 0)  # 2.0: the hashing section and its token map
STATE_WRITING, STATE_COMPLETE = 0, 1
STATE_OFFSET = 16
ALIGN = 2 * 1024 * 1024
HEADER_BYTES = ALIGN
_FIXED = struct.Struct("<8sIIII Q")  # magic, major, minor, state, reserved, json length


def align_up(n: int, alignment: int = ALIGN) -> int:
    return (n + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class TableLayer:
    layout: LayerLayout
    offset: int  # byte offset of the layer's first row in the file

    @property
    def nbytes(self) -> int:
        return self.layout.rows * self.layout.row_bytes


@dataclass(frozen=True)
class TableHeader:
    layers: tuple[TableLayer, ...]
    fingerprint: str
    checkpoint: str
    generation: int
    total_bytes: int
    hashing: HashingSection | None = None

    @classmethod
    def plan(cls, layouts: list[LayerLayout], fingerprint: str, checkpoint: str, generation: int,
             hashing: HashingSection | None = None) -> "TableHeader":
        offset, layers = HEADER_BYTES, []
        if hashing is not None:
            hashing = hashing.placed(offset)
            offset = align_up(offset + hashing.map_bytes)
        for layout in layouts:
            layers.append(TableLayer(layout, offset))
            offset = align_up(offset + layout.rows * layout.row_bytes)
        return cls(tuple(layers), fingerprint, checkpoint, generation, offset, hashing)

    def layer(self, layer_id: int) -> TableLayer:
        for entry in self.layers:
            if entry.layout.layer == layer_id:
                return entry
        raise KeyError(layer_id)

    def to_json(self) -> dict[str, Any]:
        return {"layers": [dict(entry.layout.to_dict(), offset=entry.offset) for entry in self.layers],
                "fingerprint": self.fingerprint, "checkpoint": self.checkpoint,
                "generation": self.generation, "total_bytes": self.total_bytes,
                "hashing": self.hashing.to_json() if self.hashing is not None else None}

    def encode(self, state: int) -> bytes:
        body = json.dumps(self.to_json(), sort_keys=True).encode()
        if _FIXED.size + len(body) > HEADER_BYTES:
            raise TableFileError(f"table header of {len(body)} bytes does not fit in {HEADER_BYTES}")
        return _FIXED.pack(MAGIC, *FORMAT_VERSION, state, 0, len(body)) + body

    @classmethod
    def decode(cls, blob: bytes, where: str) -> tuple["TableHeader", int]:
        """Parse a header; returns (header, state).  Raises TableFileError naming ``where``."""
        if len(blob) < _FIXED.size:
            raise TableFileError(f"{where}: file too short for a table header")
        magic, major, _minor, state, _reserved, length = _FIXED.unpack_from(blob)
        if magic != MAGIC:
            raise TableFileError(f"{where}: not an engram table (magic {magic!r})")
        if major != FORMAT_VERSION[0]:
            raise TableFileError(f"{where}: table format {major}.x, but this engram_client reads only format "
                                 f"{FORMAT_VERSION[0]}.x; use the engram_client release that matches the engramd "
                                 "that wrote the table")
        if _FIXED.size + length > min(len(blob), HEADER_BYTES):
            raise TableFileError(f"{where}: header JSON length {length} overruns the header")
        try:
            raw = json.loads(blob[_FIXED.size:_FIXED.size + length])
            layers = tuple(TableLayer(LayerLayout.from_dict(entry), int(entry["offset"])) for entry in raw["layers"])
            header = cls(layers, str(raw["fingerprint"]), str(raw["checkpoint"]), int(raw["generation"]),
                         int(raw["total_bytes"]), HashingSection.from_json(raw.get("hashing"), where))
        except (ValueError, KeyError, TypeError) as exc:
            raise TableFileError(f"{where}: damaged header JSON: {exc}") from exc
        hashing = header.hashing
        if hashing is not None and (hashing.map_offset < HEADER_BYTES or
                                    hashing.map_offset + hashing.map_bytes > header.total_bytes):
            raise TableFileError(f"{where}: token map at offset {hashing.map_offset} does not fit a "
                                 f"{header.total_bytes}-byte table")
        for entry in header.layers:
            if entry.offset % ALIGN or entry.offset < HEADER_BYTES or entry.offset + entry.nbytes > header.total_bytes:
                raise TableFileError(f"{where}: layer {entry.layout.layer} at offset {entry.offset} "
                                     f"does not fit a {header.total_bytes}-byte table")
        return header, state


def read_header(path: str, require_complete: bool = True, fd: int | None = None) -> tuple[TableHeader, int]:
    """Read and check a table file's header without mapping its data (from ``fd``, an open
    descriptor of ``path``, where given: the file already checked, not whatever has the name now)."""
    try:
        if fd is None:
            with open(path, "rb") as f:
                size, blob = _header_bytes(f.fileno(), path)
        else:
            size, blob = _header_bytes(fd, path)
    except OSError as exc:
        raise TableFileError(f"{path}: cannot read table file: {exc.strerror}") from exc
    header, state = TableHeader.decode(blob, path)
    if require_complete and state != STATE_COMPLETE:
        raise TableFileError(f"{path}: table is not complete (state {state}); it is still being written or was abandoned")
    if size < header.total_bytes:
        raise TableFileError(f"{path}: file has {size} bytes, its header says {header.total_bytes}")
    return header, state


def _header_bytes(fd: int, path: str) -> tuple[int, bytes]:
    # Read through a mapping, not read(2): hugetlbfs files support only mmap.
    size = os.fstat(fd).st_size
    if size < HEADER_BYTES:
        raise TableFileError(f"{path}: {size} bytes is too short for a table file")
    with mmap.mmap(fd, HEADER_BYTES, prot=mmap.PROT_READ) as view:
        return size, bytes(view[:HEADER_BYTES])
