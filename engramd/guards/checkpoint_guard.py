"""Noticing a checkpoint that changed while it was being loaded.

A load reads each shard for seconds to minutes; a shard overwritten meanwhile (``cp``
over it, ``dd conv=notrunc``, an rsync in place) would give a table of rows from neither
version, published under the old fingerprint.  So a load:

1. records each shard's identity before the first byte is read: device, inode, size,
   mtime and ctime (ctime cannot be set back by anyone but the kernel's clock);
2. after the last byte, records it again: any difference fails the load;
3. re-reads a sample of rows from the checkpoint (the first and last of each layer and
   a few spread between) and compares them with what went into the table: a change
   that kept every stat field would still have to leave every sampled row alone.

A failed check raises CheckpointError naming the shard and what changed; the caller
publishes nothing.  Owns no files; reads through the load's own source.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from engram_client.core.errors import CheckpointError
from engram_client.core.table_file import TableHeader

SAMPLED_ROWS_PER_LAYER = 16


@dataclass(frozen=True)
class FileIdentity:
    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: str) -> "FileIdentity":
        try:
            info = os.stat(path)
        except OSError as exc:
            raise CheckpointError(f"{path}: changed during the load: {exc.strerror}") from exc
        return cls(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)

    def differences(self, other: "FileIdentity") -> list[str]:
        return [f"{name} {getattr(self, name)} -> {getattr(other, name)}"
                for name in ("device", "inode", "size", "mtime_ns", "ctime_ns")
                if getattr(self, name) != getattr(other, name)]


def sample_rows(rows: int, count: int = SAMPLED_ROWS_PER_LAYER) -> list[int]:
    """The first, the last and evenly spread rows between: ``count`` at most, each once."""
    if rows <= count:
        return list(range(rows))
    return sorted({int(r) for r in np.linspace(0, rows - 1, count)})


class CheckpointGuard:
    def __init__(self, files: list[str]):
        self.before = {path: FileIdentity.of(path) for path in files}

    def check_unchanged(self) -> None:
        for path, before in self.before.items():
            changes = before.differences(FileIdentity.of(path))
            if changes:
                raise CheckpointError(f"{path}: changed during the load ({', '.join(changes)}); the table was not "
                                      "published. Reload once the checkpoint is no longer being written")

    def check_rows(self, source, header: TableHeader, read_table) -> None:
        """Compare sampled rows re-read from ``source`` with the table's bytes (``read_table(offset, n)``)."""
        for entry in header.layers:
            layout = entry.layout
            fresh = np.empty((1, layout.row_bytes), dtype=np.uint8)
            for row in sample_rows(layout.rows):
                source.fill(layout, row, row + 1, fresh)
                written = read_table(entry.offset + row * layout.row_bytes, layout.row_bytes)
                if bytes(fresh.reshape(-1)) != bytes(written):
                    raise CheckpointError(f"layer {layout.layer}, row {row}: the checkpoint now holds other bytes than "
                                          "were copied into the table, so it changed during the load; the table was "
                                          "not published. Reload once the checkpoint is no longer being written")

    def verify(self, source, header: TableHeader, read_table) -> None:
        self.check_unchanged()
        self.check_rows(source, header, read_table)
