"""The hot-row list a generation is served with: checked against its table, published beside it.

``serve --hot-rows FILE`` names a list (engram_client/core/hot_list.py) that an operator built;
the daemon reads it afresh for every generation (a reload picks up a rebuilt list), checks it
against the table that generation holds (layout and checkpoint fingerprint), and publishes its
own copy, re-encoded from what it checked, in its files directory beside the table:

    engramd-<instance>-g<generation>.hot     mode 0400 (0440 with --group), like the table read-only to ranks

written as ``.hot.partial`` and renamed, so a rank only ever finds a complete list.  The copy goes
with its generation: unlinking a table file (table_files.py) unlinks its list too, and a start
removes the lists its predecessor left (table_files.py; each generation publishes its own again).  Ranks open
the copy the attach reply names, never the operator's file, which may change at any time.

Owns the ``.hot`` files of its instance; what to do when a list does not fit is the load job's call.
"""
from __future__ import annotations

import hashlib
import logging
import os

from engram_client.core.errors import HotListError
from engram_client.core.hot_list import HotList, encode_hot_list, read_hot_list

from ..guards.safe_paths import foreign_reason
from ..guards.whole_files import write_then_rename

log = logging.getLogger("engramd")
SUFFIX = ".hot"


def hot_path_for(table_path: str) -> str:
    """The list published with the table file ``table_path``."""
    return table_path.removesuffix(".table") + SUFFIX


def fitting_list(source: str, layouts, fingerprint: str) -> HotList:
    """The operator's list, read (through links: the operator named it) and checked against the table."""
    hot = read_hot_list(os.path.realpath(source))
    hot.check_against(layouts, fingerprint)
    return hot


def publish(hot: HotList, source: str, table_path: str, file_mode: int, gid: int | None) -> dict:
    """Write the daemon's copy of ``hot`` beside ``table_path``; returns what status says of it."""
    data = encode_hot_list(hot.fingerprint, hot.layer_info, {layer: (hot.ranked(layer), hot.counts(layer))
                                                             for layer in hot.layers}, hot.built_from)
    final = hot_path_for(table_path)
    partial = final + ".partial"
    for path in (partial, final):  # our own leftovers (a crash, a re-adopted generation) are replaced
        if os.path.lexists(path):
            why_not = foreign_reason(path)
            if why_not is not None:
                raise HotListError(f"cannot publish the hot-row list as {final}: {why_not}")
            os.unlink(path)

    def read_only(fd: int) -> None:  # nobody writes a published list
        if gid is not None:
            os.fchown(fd, -1, gid)
        os.fchmod(fd, file_mode & 0o440)

    write_then_rename(partial, final, data, HotListError, prepare=read_only)
    log.info("hot-row list %s published as %s (%s rows over layers %s)", source, final,
             f"{sum(info.count for info in hot.layer_info):,}", list(hot.layers))
    return {**hot.describe(), "path": final, "source": source, "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data)}


def attach_view(described: dict | None) -> dict | None:
    """The attach reply's ``hot_rows``: what a rank needs to open and check the copy."""
    if described is None:
        return None
    return {key: described[key] for key in ("path", "sha256", "bytes", "layers")}
