"""A file written whole under a fresh name and only then renamed to its own: a reader of the final
name sees no file or the complete one, never a part (a hot-row list built on disk, the daemon's
published copy of one).  The fresh name is created exclusively and never followed, so it can
neither overwrite nor write through a file someone else put there."""
from __future__ import annotations

import os
from typing import Callable


def write_then_rename(temporary: str, final: str, data: bytes, error: type[Exception], mode: int = 0o600,
                      prepare: Callable[[int], None] | None = None, durable: bool = False) -> None:
    """Create ``temporary`` (O_EXCL, O_NOFOLLOW, ``mode``), let ``prepare(fd)`` set its owner or mode,
    write ``data``, and rename it to ``final``; if ``durable``, fsync the file before the rename and
    its directory after it (the rename itself survives a crash).  Any failure removes the
    temporary; an OSError becomes ``error`` naming the file (given OSError, it stays one)."""
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        raise _failure(error, f"cannot create {temporary}", exc) from exc
    try:
        try:
            if prepare is not None:
                prepare(fd)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temporary, final)
    except BaseException as exc:
        try:
            os.unlink(temporary)
        except FileNotFoundError:  # renamed already, or never written
            pass
        if isinstance(exc, OSError):
            raise _failure(error, f"cannot write {final}", exc) from exc
        raise
    if durable:
        try:
            directory = os.open(os.path.dirname(final) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as exc:
            raise _failure(error, f"cannot sync the directory of {final}", exc) from exc


def _failure(error: type[Exception], what: str, exc: OSError) -> Exception:
    """``error`` for ``exc``; an OSError class keeps the errno and strerror (its caller words the message)."""
    if issubclass(error, OSError):
        return error(exc.errno, exc.strerror, exc.filename)
    return error(f"{what}: {exc.strerror}")
