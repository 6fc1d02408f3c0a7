"""One table generation: where it comes from, how far its load is, where its file is."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from engram_client.core.protocol import LOADING, READY
from engram_client.core.table_file import TableHeader

from ..loading.loader import Progress


@dataclass
class Generation:
    number: int
    checkpoint: str | None  # None: the embedded demo table
    state: str = LOADING
    header: TableHeader | None = None
    path: str | None = None  # set once the file is complete and has its final name
    files: list[str] = field(default_factory=list)
    progress: Progress = field(default_factory=Progress)
    error: str | None = None
    adopted: bool = False  # re-adopted from a predecessor's complete file instead of loaded
    retired_at: float | None = None  # monotonic time it stopped being the served one
    by_reload: bool = False  # started by the reload operation, not by the process's first load
    huge_pages: dict | None = None  # its file's huge-page coverage, measured once ready (huge_pages.py)
    hot_rows: dict | None = None  # the hot-row list published with it (shm/hot_rows_file.py), as status says it
    hot_rows_error: str | None = None  # why it is served without the --hot-rows list

    def describe(self, clients: int) -> dict[str, Any]:
        return {"generation": self.number, "state": self.state, "checkpoint": self.checkpoint or "<demo>",
                "path": self.path, "clients": clients, "adopted": self.adopted, "error": self.error,
                "retiring": self.retired_at is not None, "load": self.progress.snapshot(),
                "hot_rows": self.hot_rows["path"] if self.hot_rows else None, "hot_rows_error": self.hot_rows_error}

    def file_problem(self) -> str | None:
        """Why this ready generation's file can no longer be served, or None.  It must still hold
        every byte its header promises: a mapped page past a cut kills whoever reads it (SIGBUS),
        and a client refuses to map a file shorter than its header."""
        if self.state != READY or self.path is None or self.header is None:
            return None
        try:
            size = os.stat(self.path).st_size
        except OSError as exc:
            return f"its table file {self.path} is gone ({exc.strerror}); no client can attach to it"
        if size >= self.header.total_bytes:
            return None
        return (f"its table file {self.path} was truncated to {size} bytes of the {self.header.total_bytes} served "
                "(not by engramd); clients that read past the cut die of SIGBUS. `engramd reload` or a restart "
                "serves a complete table again")
