"""A read-only, shared mapping of a table file, made with mmap(2) directly.

The file is opened once (``open_table_file``): its owner and its header are checked on
that descriptor, and the mapping is made from it, so the name cannot be swapped for
another file between the checks and the mmap.

Python's mmap cannot be closed while a buffer export lives and cannot hand out a
writable-looking buffer of a PROT_READ mapping, which torch wants; a mapping made
through libc has neither problem.  The pages are PROT_READ: a stray write from a
rank faults in that rank instead of corrupting the table every rank shares.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os

import torch

from ..core.errors import TableFileError
from .socket_trust import check_table_owner

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_MAP_FAILED = ctypes.c_void_p(-1).value


def open_table_file(path: str, daemon_uid: int | None = None) -> int:
    """A read-only descriptor of the table file ``path``, once its owner is one this client trusts
    (``daemon_uid``: the owner of the socket it talks through)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise TableFileError(f"{path}: cannot open table file: {exc.strerror}") from exc
    try:
        check_table_owner(path, os.fstat(fd), daemon_uid)
    except BaseException:
        os.close(fd)
        raise
    return fd


class ReadOnlyMapping:
    def __init__(self, path: str, nbytes: int, fd: int):
        """Map ``nbytes`` of ``fd`` (from open_table_file; the caller closes it: the mapping keeps
        the file alive, even once it is unlinked)."""
        self.path, self.nbytes = path, nbytes
        self.inode = os.fstat(fd).st_ino  # a restarted daemon may give a new table the same name
        address = _libc.mmap(None, nbytes, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise TableFileError(f"{path}: mmap of {nbytes} bytes failed: {os.strerror(err)}")
        self.address = address

    def tensor(self, offset: int, nbytes: int) -> torch.Tensor:
        """A uint8 CPU tensor over [offset, offset + nbytes) of the mapping (no copy)."""
        if offset < 0 or offset + nbytes > self.nbytes:
            raise TableFileError(f"{self.path}: range [{offset}, {offset + nbytes}) outside the {self.nbytes}-byte mapping")
        buffer = (ctypes.c_uint8 * nbytes).from_address(self.address + offset)
        return torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes)

    def close(self) -> None:
        if self.address is not None:
            _libc.munmap(self.address, self.nbytes)
            self.address = None
