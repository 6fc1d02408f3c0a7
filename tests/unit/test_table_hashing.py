"""The table file's hashing section (format 2): placement, codec, damage, and the writer.

Headers are built with TableHeader.plan and checked against the layout drawn in
table_file's docstring; damaged sections are written by hand into the JSON.
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

from engram_client.core.errors import TableFileError
from engram_client.core.hashing_section import HashingSection, ngram_multipliers
from engram_client.core.layout import EngramConfig, build_layout
from engram_client.core.table_file import ALIGN, FORMAT_VERSION, HEADER_BYTES, MAGIC, STATE_COMPLETE, TableHeader, \
    read_header
from engramd.synth.writer import synth_config
from engramd.shm.table_files import TableWriter

FIXED = struct.Struct("<8sIIIIQ")


def section(vocab: int = 1000, compressed: int = 700) -> HashingSection:
    token_map = (np.arange(vocab) % compressed).astype(np.int32)
    return HashingSection.build(token_map, compressed, 2, 4, (1, 14))


def planned(hashing: HashingSection | None) -> TableHeader:
    layouts = build_layout(EngramConfig.from_dict(synth_config(50, [1, 14], 4, 8, 64)))
    return TableHeader.plan(layouts, "f" * 32, "/ckpt", 3, hashing)


def blob_of(body: dict, major: int = FORMAT_VERSION[0]) -> bytes:
    raw = json.dumps(body).encode()
    return FIXED.pack(MAGIC, major, 0, STATE_COMPLETE, 0, len(raw)) + raw


def test_format_two_places_the_map_before_the_layers():
    assert FORMAT_VERSION[0] == 2
    header = planned(section(vocab=ALIGN // 4 + 1))  # a map one int past 2 MiB takes two blocks
    assert header.hashing.map_offset == HEADER_BYTES
    assert header.layers[0].offset == HEADER_BYTES + 2 * ALIGN
    assert planned(None).layers[0].offset == HEADER_BYTES  # no map, no gap


def test_section_round_trips_and_equality_ignores_the_array():
    header = planned(section())
    decoded, _ = TableHeader.decode(header.encode(STATE_COMPLETE), "t")
    assert decoded.hashing == header.hashing and decoded.hashing.token_map is None
    assert decoded.hashing.multipliers[1] == ngram_multipliers(14, 4, 700)
    assert decoded.hashing.pad_id == 2
    assert planned(section(compressed=699)).hashing != header.hashing


@pytest.mark.parametrize("change, words", [
    ({"multipliers": [[2, 3, 5, 7], [1, 3, 5, 7]]}, "odd"),
    ({"multipliers": [[1, 3, 5]]}, "multiplier rows"),
    ({"compressed_vocab": 5000}, "compressed_vocab 5000"),
    ({"pad_id": 700}, "pad id"),
    ({"map_offset": 16}, "token map at offset 16"),
    ({"vocab": 10**9}, "does not fit"),
    ({"max_ngram": "four"}, "damaged hashing section"),
])
def test_damaged_sections_are_refused(change, words):
    body = planned(section()).to_json()
    body["hashing"].update(change)
    with pytest.raises(TableFileError, match=words) as info:
        TableHeader.decode(blob_of(body), "where.table")
    assert "where.table" in str(info.value)


def test_a_format_one_file_is_refused_by_name():
    body = planned(None).to_json()
    with pytest.raises(TableFileError, match=r"table format 1.x, but this engram_client reads only format 2.x"):
        TableHeader.decode(blob_of(body, major=1), "old.table")


def test_writer_puts_the_map_where_the_header_says(tmp_path):
    hashing = section()
    header = planned(hashing)
    writer = TableWriter(str(tmp_path / "t.table"), header, 0o600)
    path = writer.publish()
    found, _ = read_header(path)
    with open(path, "rb") as f:
        f.seek(found.hashing.map_offset)
        raw = np.frombuffer(f.read(found.hashing.map_bytes), dtype="<i4")
    np.testing.assert_array_equal(found.hashing.read_map(raw, path), hashing.token_map)
    damaged = raw.copy()
    damaged[5] = 699 - damaged[5]
    with pytest.raises(TableFileError, match="does not match its digest"):
        found.hashing.read_map(damaged, path)
    os.unlink(path)
