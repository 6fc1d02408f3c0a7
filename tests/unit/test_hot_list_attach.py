"""The client's checks of the hot-row list an attach reply names (engram_client/attach/hot_rows.py), on real
files: a reply is believed only for a list beside the table, unwritable by others, of the published size and
digest, built for the mapped table."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from engram_client.attach.hot_rows import open_hot_list
from engram_client.core.errors import HotListError
from engram_client.core.hot_list import encode_hot_list
from engram_client.core.layout import LayerLayout

LAYOUTS = [LayerLayout(2, 64, (101, 103))]


@pytest.fixture
def published(tmp_path):
    data = encode_hot_list("fp", LAYOUTS, {2: (np.array([5, 9]), np.array([3, 1]))}, {"tokens": 10})
    path = tmp_path / "engramd-x-g1.hot"
    path.write_bytes(data)
    os.chmod(path, 0o400)
    table = str(tmp_path / "engramd-x-g1.table")
    reply = {"path": str(path), "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "layers": {"2": 2}}
    return reply, table


def test_a_published_list_is_read_and_checked(published):
    reply, table = published
    hot = open_hot_list(reply, table, LAYOUTS, "fp")
    assert hot.ranked(2).tolist() == [5, 9]
    assert open_hot_list(None, table, LAYOUTS, "fp") is None


def test_a_list_not_beside_the_table_is_refused(published, tmp_path):
    reply, _ = published
    with pytest.raises(HotListError, match="is not beside the table"):
        open_hot_list(reply, "/elsewhere/engramd-x-g1.table", LAYOUTS, "fp")
    with pytest.raises(HotListError, match="names no file"):
        open_hot_list({"path": 7}, "/x", LAYOUTS, "fp")


def test_a_writable_resized_or_changed_list_is_refused(published):
    reply, table = published
    os.chmod(reply["path"], 0o620)
    with pytest.raises(HotListError, match=r"writable by group or others \(mode 0620\)"):
        open_hot_list(reply, table, LAYOUTS, "fp")
    os.chmod(reply["path"], 0o400)
    with pytest.raises(HotListError, match="bytes, the daemon published"):
        open_hot_list({**reply, "bytes": reply["bytes"] + 8}, table, LAYOUTS, "fp")
    with pytest.raises(HotListError, match="is not the published"):
        open_hot_list({**reply, "sha256": "0" * 64}, table, LAYOUTS, "fp")


def test_a_link_or_a_list_for_another_table_is_refused(published, tmp_path):
    reply, table = published
    link = tmp_path / "engramd-x-g2.hot"
    link.symlink_to(reply["path"])
    with pytest.raises(HotListError, match="cannot open the hot-row list"):
        open_hot_list({**reply, "path": str(link)}, table, LAYOUTS, "fp")
    with pytest.raises(HotListError, match="fingerprint fp .* the table's is other"):
        open_hot_list(reply, table, LAYOUTS, "other")
