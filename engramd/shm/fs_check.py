"""Is ``--shm-dir`` memory, and what pages will the table get there?

The table must live in memory: on tmpfs (``/dev/shm``, with 4 KiB pages, or 2 MiB
ones when mounted ``huge=always``) or on hugetlbfs (its mount's page size).  On a
disk file system the daemon would write the table to disk and every rank would
page it in from there, so any other file system is refused unless the operator
says ``--allow-disk``.  The file system is told by statfs(2)'s magic number, the
one thing a bind mount or a container cannot disguise; mount options (read-only,
``huge=``) come from /proc/self/mounts.

Owns no files: it only looks at the directory.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass

from engram_client.core.errors import ConfigError

TMPFS_MAGIC = 0x01021994
HUGETLBFS_MAGIC = 0x958458F6
MEMORY_FILESYSTEMS = {TMPFS_MAGIC: "tmpfs", HUGETLBFS_MAGIC: "hugetlbfs"}
THP_SIZE_PATH = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


class _StatFs(ctypes.Structure):
    # struct statfs on 64-bit Linux starts with f_type and f_bsize (both __fsword_t, a long);
    # the rest is padding large enough for the remaining fields.
    _fields_ = [("f_type", ctypes.c_long), ("f_bsize", ctypes.c_long), ("rest", ctypes.c_byte * 256)]


@dataclass(frozen=True)
class ShmFilesystem:
    directory: str
    kind: str  # "tmpfs", "hugetlbfs", or the mount table's name for anything else
    in_memory: bool
    page_size: int
    read_only: bool

    def describe(self) -> str:
        """One log line: where the table goes and what pages it gets."""
        if not self.in_memory:
            return (f"shm dir {self.directory} is on {self.kind}, not in memory (--allow-disk): the table lives "
                    f"on disk and ranks page it in from there")
        line = f"shm dir {self.directory} is {self.kind}: the table gets {page_size_text(self.page_size)} pages"
        if self.page_size <= os.sysconf("SC_PAGE_SIZE"):
            line += " (a huge=always tmpfs or a hugetlbfs mount gives 2 MiB pages, fewer TLB misses on lookups)"
        return line


def page_size_text(size: int) -> str:
    return f"{size // 2**20} MiB" if size >= 2**20 else f"{size // 2**10} KiB"


def _statfs(directory: str) -> _StatFs:
    result = _StatFs()
    if _libc.statfs(os.fsencode(directory), ctypes.byref(result)) != 0:
        err = ctypes.get_errno()
        raise ConfigError(f"--shm-dir {directory}: cannot inspect its file system: {os.strerror(err)}")
    return result


def statfs_magic(directory: str) -> int | None:
    """The file system's statfs(2) magic number of ``directory`` (None: it cannot be inspected)."""
    result = _StatFs()
    return result.f_type & 0xFFFFFFFF if _libc.statfs(os.fsencode(directory), ctypes.byref(result)) == 0 else None


def _mount_of(directory: str) -> tuple[str, list[str]]:
    """The file system type and options of the mount holding ``directory`` (longest mount point wins)."""
    best, found = "", ("unknown file system", [])
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 4:
                    continue
                point = fields[1].replace("\\040", " ")
                if (directory == point or directory.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                    best, found = point, (fields[2], fields[3].split(","))
    except OSError:
        pass
    return found


def _tmpfs_page_size(options: list[str]) -> int:
    if "huge=always" in options or "huge=within_size" in options:
        try:
            with open(THP_SIZE_PATH) as f:
                return int(f.read())
        except (OSError, ValueError):
            return 2 * 2**20
    return os.sysconf("SC_PAGE_SIZE")


def inspect_shm_dir(directory: str) -> ShmFilesystem:
    directory = os.path.realpath(directory)
    stats = _statfs(directory)
    magic = stats.f_type & 0xFFFFFFFF
    mount_type, options = _mount_of(directory)
    kind = MEMORY_FILESYSTEMS.get(magic, mount_type)
    if magic == HUGETLBFS_MAGIC:
        page_size = stats.f_bsize
    elif magic == TMPFS_MAGIC:
        page_size = _tmpfs_page_size(options)
    else:
        page_size = os.sysconf("SC_PAGE_SIZE")
    return ShmFilesystem(directory, kind, magic in MEMORY_FILESYSTEMS, page_size, "ro" in options)


def check_shm_dir(directory: str, allow_disk: bool) -> ShmFilesystem:
    """Refuse an shm dir the daemon cannot write, or one on disk unless ``allow_disk``."""
    found = inspect_shm_dir(directory)
    if found.read_only:
        raise ConfigError(f"--shm-dir {directory} is on a read-only file system ({found.kind} mounted ro); "
                          "the daemon must write the table there")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"--shm-dir {directory}: this user (uid {os.getuid()}) may not create files there")
    if not found.in_memory and not allow_disk:
        raise ConfigError(f"--shm-dir {directory} is on {found.kind}, not tmpfs or hugetlbfs: the table would be "
                          "written to disk and every rank would page it in from there. Use /dev/shm, a tmpfs or "
                          "a hugetlbfs mount, or pass --allow-disk (ENGRAMD_ALLOW_DISK=1) to accept a disk")
    return found
