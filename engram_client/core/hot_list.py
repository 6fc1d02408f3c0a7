"""The hot-row list: per layer, the table's row ids ranked most frequent first, with their counts.

Written by ``engramd hot-rows build`` from text, served by the daemon beside the table it was
built for (a validated copy in its shm dir), read by every rank at attach to fill the fixed part
of its HBM row cache.  Its bytes, all little-endian:

    offset 0    magic  b"ENGRAMHL"                              8 bytes
    offset 8    format major, minor                              2 x u32
    offset 16   JSON length N (at most MAX_HEADER_BYTES)         u64
    offset 24   JSON (utf-8, N bytes), zero padding to 8 bytes:
                {"fingerprint": <the checkpoint's, as status and attach name it>,
                 "layers": [{"layer", "rows", "row_bytes", "count"}, ...],
                 "built_from": {"checkpoint", "files", "files_total", "tokens", "built_at"}}
    then        per layer in header order: ``count`` int64 row ids, then ``count`` int64 counts

A list is read from a file nobody vouches for: every size is checked against the file's real
size before anything is allocated, ids must be unique and within [0, rows), counts non-negative
and non-increasing (the file's order is the rank; a list whose counts rise is refused, not
re-sorted, since only a damaged or foreign writer makes one).  No pickle anywhere.  Every
refusal is a HotListError naming the file and what is wrong.  Torch-free: the daemon reads it.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .errors import HotListError

MAGIC = b"ENGRAMHL"
FORMAT_VERSION = (1, 0)
_FIXED = struct.Struct("<8sIIQ")  # magic, major, minor, json length
MAX_HEADER_BYTES = 1 << 20
MAX_LAYERS = 1024
MAX_ROWS = 1 << 40  # as layout.py's MAX_VOCAB: far above any real layer
MAX_FILES_NAMED = 64  # built_from names at most this many text files (files_total counts them all)


@dataclass(frozen=True)
class HotLayer:
    layer: int
    rows: int  # the layer's rows in the table the list was built for
    row_bytes: int
    count: int  # ids in the list


@dataclass(frozen=True)
class HotList:
    path: str
    fingerprint: str
    layer_info: tuple[HotLayer, ...]
    built_from: dict[str, Any]
    sha256: str  # of the whole file
    size: int
    _ids: dict[int, np.ndarray] = field(repr=False, compare=False)
    _counts: dict[int, np.ndarray] = field(repr=False, compare=False)

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(info.layer for info in self.layer_info)

    def ranked(self, layer: int) -> np.ndarray:
        """The layer's row ids, int64, most frequent first (read-only)."""
        return self._ids[self._known(layer)]

    def counts(self, layer: int) -> np.ndarray:
        """How often each of ``ranked(layer)`` was seen in the text the list was built from."""
        return self._counts[self._known(layer)]

    def _known(self, layer: int) -> int:
        if layer not in self._ids:
            raise HotListError(f"{self.path}: no layer {layer} in the hot-row list (it has {list(self.layers)})")
        return layer

    def check_against(self, layouts: Sequence, fingerprint: str) -> None:
        """Refuse a list built for another table: ``layouts`` (LayerLayout-like: layer, rows,
        row_bytes) and the table's checkpoint fingerprint must be the ones it was built for."""
        table = [(layout.layer, layout.rows, layout.row_bytes) for layout in layouts]
        mine = [(info.layer, info.rows, info.row_bytes) for info in self.layer_info]
        if mine != table:
            raise HotListError(f"{self.path}: the hot-row list was built for layers (layer, rows, row bytes) {mine}, "
                               f"the table has {table}: build one for this checkpoint (engramd hot-rows build)")
        if fingerprint != self.fingerprint:
            raise HotListError(f"{self.path}: the hot-row list was built for the checkpoint with fingerprint "
                               f"{self.fingerprint} ({self.built_from.get('checkpoint', '?')}), the table's is "
                               f"{fingerprint}: build one for this checkpoint (engramd hot-rows build)")

    def describe(self) -> dict[str, Any]:
        """What status and the attach reply say of it; ``layers`` keyed by the layer number as a string."""
        return {"path": self.path, "sha256": self.sha256, "bytes": self.size,
                "layers": {str(info.layer): info.count for info in self.layer_info}, "built_from": self.built_from}


def _header_blob(fingerprint: str, infos: list[HotLayer], built_from: dict[str, Any]) -> bytes:
    meta = {"fingerprint": fingerprint, "built_from": built_from,
            "layers": [{"layer": i.layer, "rows": i.rows, "row_bytes": i.row_bytes, "count": i.count} for i in infos]}
    blob = json.dumps(meta, sort_keys=True).encode()
    if len(blob) > MAX_HEADER_BYTES:
        raise HotListError(f"the hot-row list's header would be {len(blob)} bytes, over {MAX_HEADER_BYTES}")
    return blob


def encode_hot_list(fingerprint: str, layouts: Sequence, ranked: dict[int, tuple[np.ndarray, np.ndarray]],
                    built_from: dict[str, Any]) -> bytes:
    """The file's bytes: for each of ``layouts``, ``ranked[layer]`` = (ids, counts), most frequent first."""
    infos = [HotLayer(layout.layer, layout.rows, layout.row_bytes, int(len(ranked[layout.layer][0])))
             for layout in layouts]
    blob = _header_blob(fingerprint, infos, built_from)
    parts = [_FIXED.pack(MAGIC, *FORMAT_VERSION, len(blob)), blob, b"\0" * (-len(blob) % 8)]
    for layout in layouts:
        ids, counts = ranked[layout.layer]
        parts += [np.ascontiguousarray(ids, dtype="<i8").tobytes(), np.ascontiguousarray(counts, dtype="<i8").tobytes()]
    return b"".join(parts)


def is_hot_list(path: str) -> bool:
    """Whether ``path`` is a regular file that starts as a hot-row list does (what --force may replace)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.pread(fd, len(MAGIC), 0) == MAGIC
    finally:
        os.close(fd)


def _integer(raw: Any, name: str, low: int, high: int, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        raise HotListError(f"{where}: {name} must be an integer in [{low}, {high}], got {str(raw)[:40]!r}")
    return raw


# What built_from may hold, and how much of it: it reaches status replies and operators' terminals.
BUILT_FROM = {"checkpoint": str, "files": list, "files_total": int, "tokens": int, "built_at": str}
MAX_TEXT_CHARS = 4096


def _built_from(raw: dict, where: str) -> dict[str, Any]:
    """The known fields of ``built_from``, checked (others are dropped: a later writer may add some)."""
    kept = {}
    for name, kind in BUILT_FROM.items():
        if name not in raw:
            continue
        value = raw[name]
        if kind is int:
            value = _integer(value, f"built_from.{name}", 0, 1 << 62, where)
        elif kind is str:
            if not isinstance(value, str) or len(value) > MAX_TEXT_CHARS:
                raise HotListError(f"{where}: built_from.{name} must be a string of at most {MAX_TEXT_CHARS} characters")
        elif not isinstance(value, list) or len(value) > MAX_FILES_NAMED or \
                not all(isinstance(v, str) and len(v) <= MAX_TEXT_CHARS for v in value):
            raise HotListError(f"{where}: built_from.{name} must be a list of at most {MAX_FILES_NAMED} file names")
        kept[name] = value
    return kept


def _parse_header(blob: bytes, where: str) -> tuple[str, list[HotLayer], dict[str, Any]]:
    try:
        meta = json.loads(blob)
    except (ValueError, RecursionError) as exc:
        raise HotListError(f"{where}: header is not valid JSON: {type(exc).__name__}: {exc}") from exc
    if not isinstance(meta, dict) or not isinstance(meta.get("fingerprint"), str) or \
            not isinstance(meta.get("layers"), list) or not isinstance(meta.get("built_from", {}), dict):
        raise HotListError(f"{where}: header must hold a fingerprint string, a layers list and a built_from map")
    if not 1 <= len(meta["layers"]) <= MAX_LAYERS:
        raise HotListError(f"{where}: {len(meta['layers'])} layers; a list has 1..{MAX_LAYERS}")
    infos = []
    for index, raw in enumerate(meta["layers"]):
        at = f"{where}: layers[{index}]"
        if not isinstance(raw, dict):
            raise HotListError(f"{at} is not a map")
        rows = _integer(raw.get("rows"), "rows", 1, MAX_ROWS, at)
        infos.append(HotLayer(_integer(raw.get("layer"), "layer", 0, 1 << 31, at), rows,
                              _integer(raw.get("row_bytes"), "row_bytes", 1, 1 << 20, at),
                              _integer(raw.get("count"), "count", 0, rows, at)))
    if len({info.layer for info in infos}) != len(infos):
        raise HotListError(f"{where}: layers {[info.layer for info in infos]} repeat a layer")
    if len(meta["fingerprint"]) > MAX_TEXT_CHARS:
        raise HotListError(f"{where}: the fingerprint is longer than {MAX_TEXT_CHARS} characters")
    return meta["fingerprint"], infos, _built_from(meta.get("built_from", {}), where)


def _check_layer(ids: np.ndarray, counts: np.ndarray, info: HotLayer, where: str) -> None:
    at = f"{where}: layer {info.layer}"
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= info.rows):
        bad = int(np.flatnonzero((ids < 0) | (ids >= info.rows))[0])
        raise HotListError(f"{at}: row id {int(ids[bad])} at rank {bad} is outside the layer's rows [0, {info.rows})")
    if ids.size > 1:
        ordered = np.sort(ids)
        repeats = np.flatnonzero(ordered[1:] == ordered[:-1])
        if repeats.size:
            raise HotListError(f"{at}: row id {int(ordered[repeats[0]])} appears more than once")
    if counts.size and int(counts.min()) < 0:
        raise HotListError(f"{at}: a count is negative")
    if counts.size > 1:
        rising = np.flatnonzero(counts[1:] > counts[:-1])
        if rising.size:
            raise HotListError(f"{at}: counts rise at rank {int(rising[0]) + 1} ({int(counts[rising[0]])} then "
                               f"{int(counts[rising[0] + 1])}): a list is ranked most frequent first")


def open_hot_list_file(path: str) -> int:
    """A descriptor of the list at ``path``, opened without following a link (nor blocking on a FIFO)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise HotListError(f"{path}: cannot open the hot-row list: {exc.strerror}") from exc


def read_hot_list(path: str, fd: int | None = None) -> HotList:
    """Read and check a hot-row list (from ``fd`` if given, else opened without following a link)."""
    where = os.fspath(path)
    own = fd is None
    if own:
        fd = open_hot_list_file(where)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise HotListError(f"{where}: the hot-row list is not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return _read(f, info.st_size, where)
    except OSError as exc:
        raise HotListError(f"{where}: cannot read the hot-row list: {exc.strerror}") from exc
    finally:
        if own:
            os.close(fd)


def _read(f, size: int, where: str) -> HotList:
    digest = hashlib.sha256()

    def take(nbytes: int, what: str) -> bytes:
        data = f.read(nbytes)
        if len(data) != nbytes:
            raise HotListError(f"{where}: truncated: the file ends inside {what}")
        digest.update(data)
        return data

    magic, major, minor, length = _FIXED.unpack(take(_FIXED.size, "the fixed header"))
    if magic != MAGIC:
        raise HotListError(f"{where}: not a hot-row list (magic {magic!r}, expected {MAGIC!r})")
    if major != FORMAT_VERSION[0]:
        raise HotListError(f"{where}: hot-row list format {major}.{minor}; this reader reads {FORMAT_VERSION[0]}.x")
    if length > MAX_HEADER_BYTES or _FIXED.size + length > size:
        raise HotListError(f"{where}: header length {length} does not fit the {size}-byte file "
                           f"(at most {MAX_HEADER_BYTES})")
    fingerprint, infos, built_from = _parse_header(take(length, "the JSON header"), where)
    take(-length % 8, "the header's padding")
    expected = _FIXED.size + length + (-length % 8) + 16 * sum(i.count for i in infos)
    if expected != size:
        raise HotListError(f"{where}: the header declares {expected} bytes in all, the file has {size}")
    ids, counts = {}, {}
    for hot in infos:
        ids[hot.layer] = np.frombuffer(take(8 * hot.count, f"layer {hot.layer}'s ids"), dtype="<i8").astype(np.int64)
        counts[hot.layer] = np.frombuffer(take(8 * hot.count, f"layer {hot.layer}'s counts"),
                                          dtype="<i8").astype(np.int64)
        _check_layer(ids[hot.layer], counts[hot.layer], hot, where)
        ids[hot.layer].flags.writeable = counts[hot.layer].flags.writeable = False
    return HotList(where, fingerprint, tuple(infos), built_from, digest.hexdigest(), size, ids, counts)
