"""The hot-row list a daemon publishes with its table, read at attach (``MappedGeneration.hot_list``).

The attach reply's ``hot_rows`` (protocol 1.4) names the daemon's own copy of the list
(engramd/shm/hot_rows_file.py).  Before the client believes it, the file gets the table file's
trust checks and more: opened without following a link, a regular file of a trusted owner
(socket_trust.py, on the descriptor), in the table file's own directory, writable by nobody
but its owner, of the size and sha256 the reply states; then read with every check of
engram_client/core/hot_list.py and checked against the mapped table's layout and fingerprint.
Any failure is a HotListError: a daemon that says it serves a list whose file is not that list
is refused, not worked around.  The time it takes is logged (a 2% list of V4.1 is ~16 bytes x
7.7M rows per layer).  Torch-free.
"""
from __future__ import annotations

import logging
import os
import stat
import time

from ..core.errors import HotListError
from ..core.hot_list import HotList, open_hot_list_file, read_hot_list
from .socket_trust import check_table_owner

log = logging.getLogger("engram_client")


def open_hot_list(described: dict | None, table_path: str, layouts, fingerprint: str,
                  daemon_uid: int | None = None) -> HotList | None:
    """The list the attach reply's ``hot_rows`` names, checked; None where the daemon serves none."""
    if described is None:
        return None
    began = time.monotonic()
    if not isinstance(described, dict) or not isinstance(described.get("path"), str):
        raise HotListError(f"the attach reply's hot_rows {str(described)[:80]!r} names no file")
    path = described["path"]
    if os.path.dirname(path) != os.path.dirname(table_path):
        raise HotListError(f"refusing the hot-row list {path}: it is not beside the table {table_path}")
    fd = open_hot_list_file(path)
    try:
        info = os.fstat(fd)
        check_table_owner(path, info, daemon_uid, kind="hot-row list", error=HotListError)
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise HotListError(f"refusing the hot-row list {path}: writable by group or others "
                               f"(mode {stat.S_IMODE(info.st_mode):04o})")
        if info.st_size != described.get("bytes"):
            raise HotListError(f"{path}: {info.st_size} bytes, the daemon published {described.get('bytes')}")
        hot = read_hot_list(path, fd=fd)
    finally:
        os.close(fd)
    if hot.sha256 != described.get("sha256"):
        raise HotListError(f"{path}: sha256 {hot.sha256} is not the published {described.get('sha256')}")
    hot.check_against(layouts, fingerprint)
    seconds = time.monotonic() - began
    log.info("hot-row list %s: %s rows over layers %s read and checked in %.3f s", path,
             f"{sum(info.count for info in hot.layer_info):,}", list(hot.layers), seconds)
    return hot
