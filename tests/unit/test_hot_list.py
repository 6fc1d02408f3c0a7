"""The hot-row list format (engram_client/core/hot_list.py): round trip, fit checks, hostile files."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from engram_client.core.errors import HotListError
from engram_client.core.hot_list import MAGIC, encode_hot_list, is_hot_list, read_hot_list
from engram_client.core.layout import LayerLayout

LAYOUTS = [LayerLayout(2, 64, (101, 103)), LayerLayout(5, 64, (107, 109))]
BUILT = {"checkpoint": "/models/x", "files": ["a.txt"], "files_total": 1, "tokens": 1000, "built_at": "2026-12-01"}


def ranked():
    return {2: (np.array([7, 3, 150], dtype=np.int64), np.array([9, 4, 4])),
            5: (np.array([215, 0], dtype=np.int64), np.array([2, 1]))}


def write(tmp_path, data: bytes, name="hot.list"):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_round_trip(tmp_path):
    path = write(tmp_path, encode_hot_list("fp1", LAYOUTS, ranked(), BUILT))
    hot = read_hot_list(path)
    assert hot.layers == (2, 5) and hot.fingerprint == "fp1" and hot.built_from == BUILT
    assert hot.ranked(2).dtype == np.int64 and hot.ranked(2).tolist() == [7, 3, 150]
    assert hot.counts(5).tolist() == [2, 1]
    hot.check_against(LAYOUTS, "fp1")
    described = hot.describe()
    assert described["layers"] == {"2": 3, "5": 2} and described["bytes"] == (tmp_path / "hot.list").stat().st_size
    with pytest.raises(ValueError):
        hot.ranked(2)[0] = 1  # read-only: one list shared by the cache's users
    with pytest.raises(HotListError, match="no layer 3"):
        hot.ranked(3)
    assert is_hot_list(path) and not is_hot_list(str(tmp_path))


def test_an_empty_layer_is_a_list_too(tmp_path):
    lists = ranked()
    lists[5] = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    hot = read_hot_list(write(tmp_path, encode_hot_list("fp", LAYOUTS, lists, BUILT)))
    assert hot.ranked(5).size == 0


def test_check_against_names_what_differs(tmp_path):
    hot = read_hot_list(write(tmp_path, encode_hot_list("fp1", LAYOUTS, ranked(), BUILT)))
    with pytest.raises(HotListError, match="fingerprint fp1 .*/models/x.*the table's is fp2"):
        hot.check_against(LAYOUTS, "fp2")
    other = [LayerLayout(2, 64, (101, 113)), LAYOUTS[1]]
    with pytest.raises(HotListError, match=r"hot\.list: the hot-row list was built for layers"):
        hot.check_against(other, "fp1")
    with pytest.raises(HotListError, match="built for layers"):
        hot.check_against(LAYOUTS[:1], "fp1")
    with pytest.raises(HotListError, match="built for layers"):
        hot.check_against([LayerLayout(2, 32, (101, 103)), LAYOUTS[1]], "fp1")  # row bytes differ


def rebuilt(meta_change=None, arrays=None) -> bytes:
    """A file with its header edited: the hostile writer's tool."""
    data = encode_hot_list("fp", LAYOUTS, ranked(), BUILT)
    length = struct.unpack_from("<Q", data, 16)[0]
    meta = json.loads(data[24:24 + length])
    if meta_change:
        meta_change(meta)
    blob = json.dumps(meta).encode()
    body = data[24 + length + (-length % 8):] if arrays is None else arrays
    return struct.pack("<8sIIQ", MAGIC, 1, 0, len(blob)) + blob + b"\0" * (-len(blob) % 8) + body


def arrays(lists) -> bytes:
    return b"".join(np.asarray(a, dtype="<i8").tobytes() for layer in (2, 5) for a in lists[layer])


@pytest.mark.parametrize("data, message", [
    (b"", "truncated"),
    (b"NOTALIST" + bytes(16), "not a hot-row list"),
    (struct.pack("<8sIIQ", MAGIC, 2, 0, 2) + b"{}", "format 2.0"),
    (struct.pack("<8sIIQ", MAGIC, 1, 0, 1 << 40) + b"{}", "header length 1099511627776 does not fit"),
    (struct.pack("<8sIIQ", MAGIC, 1, 0, 3) + b"{x}", "not valid JSON"),
    (struct.pack("<8sIIQ", MAGIC, 1, 0, 2) + b"[]", "must hold a fingerprint"),
])
def test_hostile_headers(tmp_path, data, message):
    with pytest.raises(HotListError, match=message) as caught:
        read_hot_list(write(tmp_path, data))
    assert "hot.list" in str(caught.value)


def test_truncated_and_overlong_files(tmp_path):
    data = encode_hot_list("fp", LAYOUTS, ranked(), BUILT)
    for cut in (len(data) - 1, len(data) - 8, 30):
        with pytest.raises(HotListError, match="declares|truncated|does not fit"):
            read_hot_list(write(tmp_path, data[:cut]))
    with pytest.raises(HotListError, match="declares .* bytes in all, the file has"):
        read_hot_list(write(tmp_path, data + b"\0" * 16))


def test_huge_declared_counts_are_refused_before_anything_is_read(tmp_path):
    def huge(meta):
        meta["layers"][0]["rows"] = 1 << 40
        meta["layers"][0]["count"] = 1 << 40
    with pytest.raises(HotListError, match="declares 17592186044.* bytes in all"):
        read_hot_list(write(tmp_path, rebuilt(huge)))

    def over_rows(meta):
        meta["layers"][1]["count"] = meta["layers"][1]["rows"] + 1
    with pytest.raises(HotListError, match=r"count must be an integer in \[0, 216\]"):
        read_hot_list(write(tmp_path, rebuilt(over_rows)))

    def many_layers(meta):
        meta["layers"] = [dict(meta["layers"][0], layer=i) for i in range(2000)]
    with pytest.raises(HotListError, match="2000 layers"):
        read_hot_list(write(tmp_path, rebuilt(many_layers)))

    def repeated(meta):
        meta["layers"][1]["layer"] = 2
    with pytest.raises(HotListError, match="repeat a layer"):
        read_hot_list(write(tmp_path, rebuilt(repeated)))


def test_built_from_keeps_known_fields_of_the_right_kind(tmp_path):
    def extra(meta):
        meta["built_from"]["by"] = {"nested": [1, 2]}
    assert read_hot_list(write(tmp_path, rebuilt(extra))).built_from == BUILT  # unknown fields dropped
    for name, value, message in (("tokens", "many", "built_from.tokens must be an integer"),
                                 ("files", ["a"] * 100, "at most 64 file names"),
                                 ("files", [3], "at most 64 file names"),
                                 ("built_at", "x" * 5000, "built_from.built_at must be a string")):
        def bad(meta):
            meta["built_from"][name] = value
        with pytest.raises(HotListError, match=message):
            read_hot_list(write(tmp_path, rebuilt(bad)))


@pytest.mark.parametrize("edit, message", [
    (lambda lists: lists[2][0].__setitem__(1, 204), r"layer 2: row id 204 at rank 1 is outside .*\[0, 204\)"),
    (lambda lists: lists[5][0].__setitem__(0, -1), "row id -1 at rank 0 is outside"),
    (lambda lists: lists[2][0].__setitem__(2, 7), "row id 7 appears more than once"),
    (lambda lists: lists[2][1].__setitem__(2, 5), "counts rise at rank 2 .4 then 5."),
    (lambda lists: lists[5][1].__setitem__(1, -3), "a count is negative"),
])
def test_hostile_arrays(tmp_path, edit, message):
    lists = {layer: (ids.copy(), np.asarray(counts).copy()) for layer, (ids, counts) in ranked().items()}
    edit(lists)
    with pytest.raises(HotListError, match=message):
        read_hot_list(write(tmp_path, rebuilt(arrays=arrays(lists))))


def test_not_a_regular_file_and_links(tmp_path):
    with pytest.raises(HotListError, match="not a regular file"):
        read_hot_list(str(tmp_path))
    real = write(tmp_path, encode_hot_list("fp", LAYOUTS, ranked(), BUILT))
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(HotListError, match="link: cannot open"):
        read_hot_list(str(tmp_path / "link"))
    with pytest.raises(HotListError, match="missing: cannot open"):
        read_hot_list(str(tmp_path / "missing"))
