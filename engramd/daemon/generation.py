"""One table generation: where it comes from, how far its load is, where its file is."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from engram_client.core.protocol import LOADING, READY
from engram_client.core.table_file import TableHeader

from ..shm import huge_pages

from ..loading.loader import Progress


@dataclass
class Replica:
    """One copy of a generation's table (``--numa-replicas``; without it, the one table, node None
    or --numa-node's)."""
    node: int | None
    path: str
    huge_pages: dict | None = None  # measured once ready (huge_pages.py)

    def describe(self, nbytes: int) -> dict[str, Any]:
        return {"node": self.node, "path": self.path, "bytes": nbytes, "huge_pages": self.huge_pages}


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
    replicas: list[Replica] = field(default_factory=list)  # every copy, the first at ``path`` (replicas.py)

    def paths(self) -> list[str]:
        """Every file of this generation: each replica's, or the one table's."""
        return [replica.path for replica in self.replicas] or ([self.path] if self.path is not None else [])

    def describe(self, clients: int) -> dict[str, Any]:
        return {"generation": self.number, "state": self.state, "checkpoint": self.checkpoint or "<demo>",
                "path": self.path, "clients": clients, "adopted": self.adopted, "error": self.error,
                "retiring": self.retired_at is not None, "load": self.progress.snapshot(),
                "hot_rows": self.hot_rows["path"] if self.hot_rows else None, "hot_rows_error": self.hot_rows_error}

    def measure_huge_pages(self) -> None:
        """Each replica's huge-page coverage (logged; a large table without any warned about)."""
        for replica in self.replicas:
            replica.huge_pages = huge_pages.report(replica.path, self.header.total_bytes)
        self.huge_pages = self.replicas[0].huge_pages if self.replicas else \
            huge_pages.report(self.path, self.header.total_bytes)

    def served_replicas(self, numa_node: int | None) -> list[Replica]:
        """The copies clients may map: each replica, or the one table (on ``numa_node``, --numa-node's)."""
        return self.replicas or ([Replica(numa_node, self.path, self.huge_pages)] if self.path is not None else [])

    def file_problem(self) -> str | None:
        """Why this ready generation's file can no longer be served, or None.  It must still hold
        every byte its header promises: a mapped page past a cut kills whoever reads it (SIGBUS),
        and a client refuses to map a file shorter than its header."""
        if self.state != READY or self.path is None or self.header is None:
            return None
        for replica in self.replicas or [Replica(None, self.path)]:
            problem = _file_problem(replica.path, self.header.total_bytes)
            if problem is not None:
                where = f" (the replica for NUMA node {replica.node})" if self.replicas and len(self.replicas) > 1 else ""
                return problem.replace("its table file", f"its table file{where}", 1) if where else problem
        return None


def _file_problem(path: str, total_bytes: int) -> str | None:
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        return f"its table file {path} is gone ({exc.strerror}); no client can attach to it"
    if size >= total_bytes:
        return None
    return (f"its table file {path} was truncated to {size} bytes of the {total_bytes} served "
            "(not by engramd); clients that read past the cut die of SIGBUS. `engramd reload` or a restart "
            "serves a complete table again")
