"""One table generation: where it comes from, how far its load is, where its file is."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engram_client.core.protocol import LOADING
from engram_client.core.table_file import TableHeader

from .loader import Progress


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
    huge_pages: dict | None = None  # its file's huge-page coverage, measured once ready (huge_pages.py)

    def describe(self, clients: int) -> dict[str, Any]:
        return {"generation": self.number, "state": self.state, "checkpoint": self.checkpoint or "<demo>",
                "path": self.path, "clients": clients, "adopted": self.adopted, "error": self.error,
                "retiring": self.retired_at is not None, "load": self.progress.snapshot()}
