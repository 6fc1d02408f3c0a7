"""Opening a checkpoint's files: regular files only, never reached by a link out of the checkpoint's root.

A reload reads whatever lies under the reload roots, and files there may be writable by
people who cannot talk to the daemon.  A link planted among a checkpoint's files must not
make the daemon (often root) read elsewhere: a shard linked to a FIFO would block the load
for ever, one linked to /etc/shadow would put that file's first bytes into an error every
peer reads, a tokenizer.json linked to /dev/zero would grow the daemon without bound.  So
every file a load (or ``inspect``) reads is

- resolved, and refused unless it lies under the checkpoint's root (``checkpoint_root``):
  links that stay inside the root are followed, so a snapshot directory whose files link
  to blobs beside it works when the root holds both;
- checked to be a regular file before it is opened, then opened without following any
  link (openat2 with RESOLVE_NO_SYMLINKS; where the kernel lacks it, O_NOFOLLOW and the
  opened file's own path checked), non-blocking, and checked again on the descriptor;
- read only up to a bound its kind allows (``read_inside``), so a huge file is refused by
  its size, not read.

A refusal is a CheckpointError naming the file as the checkpoint names it and what it is:
never where a link points, nor anything read from a file outside the root.  Owns no files.
"""
from __future__ import annotations

import ctypes
import errno
import os
import stat

from engram_client.core.errors import CheckpointError

# config.json, the index and tokenizer.json: real ones are a few MiB, the largest tokenizers tens.
MAX_JSON_BYTES = 128 * 1024 * 1024
OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_SYS_OPENAT2 = 437  # one number on every Linux architecture (added after the syscall tables were unified)
_RESOLVE_NO_SYMLINKS = 0x04
_AT_FDCWD = -100
_libc = ctypes.CDLL(None, use_errno=True)
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def checkpoint_root(directory: str, roots: list[str]) -> str:
    """The directory a checkpoint's files must lie under: the (longest) reload root holding the
    checkpoint, or the checkpoint directory itself where it lies under none (a --checkpoint
    given outside every --reload-root)."""
    real = os.path.realpath(directory)
    holding = [os.path.realpath(root) for root in roots if _inside(real, os.path.realpath(root))]
    return max(holding, key=len) if holding else real


def default_root(directory: str) -> str:
    """The root ``serve --checkpoint DIR`` uses without --reload-root: DIR's parent."""
    return checkpoint_root(directory, [os.path.dirname(os.path.abspath(directory))])


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _openat2(path: str) -> int | None:
    """``path`` opened refusing a link anywhere in it; None where this kernel has no openat2."""
    how = _OpenHow(OPEN_FLAGS, 0, _RESOLVE_NO_SYMLINKS)
    fd = _libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_long(_AT_FDCWD), ctypes.c_char_p(os.fsencode(path)),
                       ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd >= 0:
        return fd
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM):  # an old kernel, or a seccomp filter that does not know it
        return None
    raise OSError(err, os.strerror(err), path)


def open_inside(path: str, root: str) -> int:
    """A read-only, non-blocking descriptor of the regular file ``path``, which must lie under ``root``."""
    real = os.path.realpath(path)
    if not _inside(real, os.path.realpath(root)):
        raise CheckpointError(f"{path}: leads outside the checkpoint's root {root} (a symbolic link out of it); "
                              "refusing to read it")
    try:
        info = os.lstat(real)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"{path}: {_kind(info.st_mode)}, not a regular file; refusing to read it")
        fd = _openat2(real)
        if fd is None:
            fd = os.open(real, OPEN_FLAGS | os.O_NOFOLLOW)
            if os.readlink(f"/proc/self/fd/{fd}") != real:
                os.close(fd)
                raise CheckpointError(f"{path}: changed while it was being opened; refusing to read it")
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link swapped in after it was resolved
            raise CheckpointError(f"{path}: changed while it was being opened; refusing to read it") from exc
        raise CheckpointError(f"{path}: cannot open: {exc.strerror}") from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise CheckpointError(f"{path}: {_kind(mode)}, not a regular file; refusing to read it")
    return fd


def read_inside(path: str, root: str, limit: int) -> bytes:
    """The whole of the regular file ``path`` under ``root``, refused by its size if above ``limit``."""
    fd = open_inside(path, root)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise CheckpointError(f"{path}: {size} bytes, more than the {limit} this reader accepts for it")
        chunks, got = [], 0
        while got <= limit:  # the size can change while it is read: the bound holds for what is read
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror}") from exc
    finally:
        os.close(fd)
    if got > limit:
        raise CheckpointError(f"{path}: grew past the {limit} bytes this reader accepts for it while being read")
    return b"".join(chunks)
