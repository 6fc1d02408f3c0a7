"""Table files in the shm dir: naming, ownership, space, reservation, publication.

Each daemon instance (one per request endpoint) owns the files named
``engramd-<instance>-g<generation>.table`` (with ``--numa-replicas``, the first replica; each further
one ``engramd-<instance>-g<generation>-n<node>.table``; and ``.hot``, a hot-row list: hot_rows_file.py)
and holds an exclusive ``flock`` on ``engramd-<instance>.lock`` for as long as it lives.  It keeps the lock, its tables
and its served record in its files directory: the shm dir itself, or, where other users may create names
in the shm dir, a directory of its own inside it (private_dir.py), where nobody else can plant the
lock's name (a file planted under a predictable name in /dev/shm stopped the daemon from
starting).  At start a daemon removes every ``engramd-*`` table file, in the shm dir and in
this user's files directories, whose owner's lock is free (that owner is dead), and never
touches a file whose owner's lock is held, nor one of another user.

A table is written as ``<name>.partial`` with header state *writing*, then flushed,
marked *complete* and renamed: its final name appears only when every byte is in
place.  The whole file is reserved with fallocate before the first byte is
written, so a tmpfs that fills up later can never SIGBUS a reader.

Owns files in the shm dir whose names it made; must not touch anything else there.
"""
from __future__ import annotations

import hashlib
import logging
import mmap
import os
import re
from dataclasses import dataclass

from engram_client.core.errors import ShmSpaceError, TableFileError
from engram_client.core.table_file import STATE_COMPLETE, STATE_OFFSET, STATE_WRITING, TableHeader

from ..guards.lock_owner import holder, lock_is_held, write_pid
from .fs_check import HUGETLBFS_MAGIC, statfs_magic
from .numa import BoundMapping
from .private_dir import files_directory, own_directories
from ..guards.safe_paths import (UnsafePathError, check_directory, foreign_reason, release_lock, remove_if_empty,
                                 take_lock)
from ..reporting.sizes import human_bytes

log = logging.getLogger("engramd.table_store")
# A generation's table (or a replica of it) and the hot-row list published with it (hot_rows_file.py).
_TABLE_NAME = re.compile(r"^engramd-([0-9a-f]{12})-g(\d+)(?:-n(\d+))?\.(table|hot)(\.partial)?$")


def instance_id(endpoint: str) -> str:
    """A stable id per request endpoint, so a restarted daemon finds its own files."""
    return hashlib.sha256(endpoint.encode()).hexdigest()[:12]


def _gib(n: int) -> str:
    return human_bytes(n)


class ShmDir:
    """One daemon's view of its shm dir, holding the instance lock while open."""

    def __init__(self, directory: str, instance: str, file_mode: int = 0o600, gid: int | None = None):
        self.directory = os.path.abspath(directory)
        self.instance = instance
        self.file_mode = file_mode
        self.gid = gid
        if not os.path.isdir(self.directory):
            raise TableFileError(f"shm dir {self.directory} does not exist")
        check_directory(self.directory, "shm dir")  # a shared one must be sticky, like /dev/shm
        # Chosen before the lock is held: the endpoint's lock (guards/endpoint_lock.py) keeps a second
        # daemon of this instance out meanwhile; this lock tells other instances that its files are live.
        self.files_dir = files_directory(self.directory, instance, gid)
        self.lock_path = os.path.join(self.files_dir, f"engramd-{instance}.lock")
        try:
            self._lock_fd = take_lock(self.lock_path, "lock file", lambda: (
                f"another live engramd{holder(self.lock_path)} already owns it (same endpoint and shm dir); "
                "stop it first"))
        except UnsafePathError as exc:
            self._lock_fd = -1
            self.close()
            raise TableFileError(str(exc)) from exc
        write_pid(self._lock_fd)  # for people reading the dir
        # Where table files of this user's daemons may be, ours and dead ones': looked at once, at start.
        self.scanned_dirs = [self.directory] + [path for _, path in own_directories(self.directory)
                                                if path != self.directory]

    def close(self) -> None:
        if self._lock_fd >= 0:
            release_lock(self.lock_path, self._lock_fd)  # unlinked while held: see take_lock
            self._lock_fd = -1
        if self.files_dir != self.directory:
            remove_if_empty(self.files_dir)  # after the lock file went: empty once no table is left

    def table_path(self, generation: int, node: int | None = None) -> str:
        """The first replica's (or the only table's) path; ``node``: a further replica's."""
        suffix = f"-n{node}" if node is not None else ""
        return os.path.join(self.files_dir, f"engramd-{self.instance}-g{generation}{suffix}.table")

    def _table_files(self):
        """(match, path) of every name shaped like a table file in the scanned directories."""
        for directory in self.scanned_dirs:
            try:
                names = sorted(os.listdir(directory))
            except FileNotFoundError:
                continue
            for name in names:
                match = _TABLE_NAME.match(name)
                if match:
                    yield match, os.path.join(directory, name)

    def remove_orphans(self) -> list[str]:
        """Remove table files whose owning daemon is dead (its lock is free) and our own
        unfinished ones; keep our own complete tables for re-adoption.  Returns what went."""
        removed = []
        for match, path in self._table_files():
            owner, partial = match.group(1), bool(match.group(5))
            if owner == self.instance and not partial and match.group(4) == "table":
                continue  # a complete table of ours, left by our predecessor: see own_tables()
            if owner != self.instance and self._owner_alive(owner, os.path.dirname(path)):
                continue
            if foreign_reason(path) is not None:
                continue  # another user's file: never ours to remove
            if self.unlink(path):
                removed.append(path)
                log.info("removed table file %s left by a daemon that is gone", path)
        return removed

    def own_tables(self) -> list[tuple[int, str]]:
        """Our complete table files, newest generation first (a generation's further replicas after its first)."""
        found = []
        for match, path in self._table_files():
            if match.group(1) == self.instance and not match.group(5) and match.group(4) == "table":
                why_not = foreign_reason(path)  # checked before its header is read
                if why_not is not None:
                    log.warning("not re-adopting %s: %s", path, why_not)
                    continue
                found.append((int(match.group(2)), -int(match.group(3) or -1), path))
        return [(number, path) for number, _, path in sorted(found, reverse=True)]

    def unlink(self, path: str) -> bool:
        """Remove one of the files this class names (a table's with its hot-row list); refuses any other path."""
        if os.path.dirname(path) not in self.scanned_dirs or not _TABLE_NAME.match(os.path.basename(path)):
            raise TableFileError(f"refusing to unlink {path}: not a table file of {self.directory}")
        if path.endswith(".table"):
            self.unlink(path.removesuffix(".table") + ".hot")
        why_not = foreign_reason(path)
        if why_not is not None:
            log.warning("not removing %s: %s", path, why_not)
            return False
        try:
            os.unlink(path)
            return True
        except FileNotFoundError:
            return False

    def _owner_alive(self, owner: str, directory: str) -> bool:
        """Whether the daemon owning files in ``directory`` holds its lock, kept beside them; a daemon of
        an older engramd kept it in the shm dir itself (counted only if it is this user's own file)."""
        legacy = os.path.join(self.directory, f"engramd-{owner}.lock")
        return lock_is_held(os.path.join(directory, f"engramd-{owner}.lock")) or (
            directory != self.directory and foreign_reason(legacy) is None and lock_is_held(legacy))

    def check_space(self, nbytes: int, copies: int = 1) -> None:
        """Room for ``copies`` tables of ``nbytes`` (one per NUMA replica)."""
        stat = os.statvfs(self.directory)
        free, need = stat.f_bavail * stat.f_frsize, nbytes * copies
        if free < need:
            copies_text = f" ({copies} NUMA replicas of {_gib(nbytes)})" if copies > 1 else ""
            nbytes = need
            raise ShmSpaceError(
                f"shm dir {self.directory} has {_gib(free)} free but the table needs {_gib(nbytes)}{copies_text} "
                f"({nbytes} bytes). Give it more, with room for a reload's second generation beside the first: "
                f"in Docker, --shm-size={-(-2 * nbytes // 2**30) + 1}g or --ipc=host; "
                f"in Kubernetes, a larger /dev/shm on the node or a tmpfs of its own there, as the table's hostPath "
                f"(deploy/kubernetes/README.md); otherwise remount the tmpfs larger "
                f"(mount -o remount,size=... {self.directory}) or point --shm-dir at a bigger tmpfs or hugetlbfs")

    def create(self, header: TableHeader, path: str | None = None, node: int | None = None) -> "TableWriter":
        """A writer for the table (``path``, ``node``: a replica's, its pages bound to that node);
        a set of replicas checks its space for all of them first."""
        if path is None:
            self.check_space(header.total_bytes)
        return TableWriter(path or self.table_path(header.generation), header, self.file_mode, self.gid, node)


def is_hugetlbfs(path: str) -> bool:
    """Whether ``path`` lies on a hugetlbfs mount (statfs's magic number: fs_check.py)."""
    return statfs_magic(os.path.dirname(os.path.abspath(path))) == HUGETLBFS_MAGIC


def _create_exclusive(path: str, mode: int) -> int:
    """A new file at ``path``; a leftover of ours is replaced, anything else (another user's
    file, a planted symbolic link) is refused rather than opened."""
    for _ in range(2):
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        except FileExistsError:
            why_not = foreign_reason(path)
            if why_not is not None:
                raise UnsafePathError(f"cannot create {path}: {why_not}") from None
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
    raise UnsafePathError(f"cannot create {path}: something keeps re-creating it")


@dataclass
class TableWriter:
    """A table being written: a reserved ``.partial`` file."""
    final_path: str
    header: TableHeader
    file_mode: int
    gid: int | None = None
    node: int | None = None  # a NUMA replica's node: its pages are bound there before the first is made

    def __post_init__(self) -> None:
        self.partial_path = self.final_path + ".partial"
        self.fd = _create_exclusive(self.partial_path, self.file_mode)
        self.bound = None
        try:
            if self.gid is not None:
                os.fchown(self.fd, -1, self.gid)
            os.fchmod(self.fd, self.file_mode)
            os.ftruncate(self.fd, self.header.total_bytes)
            if self.node is not None:  # before fallocate makes the first page (shm/numa.py)
                self.bound = BoundMapping(self.fd, self.header.total_bytes, self.node,
                                          f"replica on NUMA node {self.node} ({self.partial_path})")
            try:
                os.posix_fallocate(self.fd, 0, self.header.total_bytes)
            except OSError as exc:
                raise ShmSpaceError(f"cannot reserve {_gib(self.header.total_bytes)} for {self.partial_path}: "
                                    f"{exc.strerror}") from exc
            # pwrite fills tmpfs ~14x faster than first-touch stores through a 4 KiB-page mapping
            # (7.5 vs 0.54 GB/s measured); hugetlbfs has no write(2), so it is filled through a mapping.
            self.map = mmap.mmap(self.fd, self.header.total_bytes) if is_hugetlbfs(self.final_path) else None
        except BaseException:
            self.abandon()
            raise
        self.write(0, self.header.encode(STATE_WRITING))
        if self.header.hashing is not None and self.header.hashing.token_map is not None:
            self.write(self.header.hashing.map_offset, self.header.hashing.token_map.astype("<i4"))

    def write(self, offset: int, data) -> None:
        """Write a bytes-like object at ``offset`` (thread-safe: positional writes only)."""
        view = memoryview(data).cast("B")
        if self.map is not None:
            self.map[offset:offset + len(view)] = view
            return
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], offset + done)

    def read(self, offset: int, nbytes: int) -> bytes:
        """Bytes already written at ``offset`` (for checks before publication)."""
        if self.map is not None:
            return self.map[offset:offset + nbytes]
        return os.pread(self.fd, nbytes, offset)

    def publish(self) -> str:
        """Mark the header complete once every byte is written, and give the file its final name."""
        if self.map is not None:
            self.map.flush()
        self.write(STATE_OFFSET, STATE_COMPLETE.to_bytes(4, "little"))
        if self.map is not None:
            self.map.flush()
        os.rename(self.partial_path, self.final_path)
        self._release()
        return self.final_path

    def abandon(self) -> None:
        """Drop a table that will not be completed; its file disappears."""
        try:
            os.unlink(self.partial_path)
        except FileNotFoundError:
            pass
        self._release()

    def _release(self) -> None:
        if getattr(self, "bound", None) is not None:
            self.bound.close()
            self.bound = None
        if getattr(self, "map", None) is not None:
            self.map.close()
            self.map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
