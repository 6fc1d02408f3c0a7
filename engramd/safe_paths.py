"""Opening and binding only through paths the daemon's own user controls.

The daemon often runs as root with its table files in /dev/shm (mode 1777), where any
local user may create names.  So before it reads, locks or binds anything there it checks:

- files are opened with ``O_NOFOLLOW`` and checked on the open descriptor (``fstat``):
  a regular file, owned by the daemon's effective uid, not writable by group or others;
- directories are not symbolic links, and are owned by the daemon's user (or root) and
  not writable by group or others, unless the sticky bit is set: then others may create
  names there but cannot rename or remove ours;
- a file lock held by someone else is reported with the holder's pid (from /proc/locks)
  and the file's owner.

Every refusal raises UnsafePathError naming the path, what is wrong and whose it is.
Owns no files; callers decide what to do with what it opens.
"""
from __future__ import annotations

import errno
import fcntl
import os
import pwd
import stat
from typing import Callable

from engram_client.core.errors import ConfigError

GROUP_OR_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH


class UnsafePathError(ConfigError):
    code = "unsafe_path"


def describe_owner(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def check_owned(info: os.stat_result, path: str, what: str) -> None:
    """Raise unless ``info`` is a regular file of ours that only we may write."""
    if not stat.S_ISREG(info.st_mode):
        raise UnsafePathError(f"{what} {path} is not a regular file; refusing to use it")
    if info.st_uid != os.geteuid():
        raise UnsafePathError(f"{what} {path} belongs to {describe_owner(info.st_uid)}, not to engramd's user "
                              f"({describe_owner(os.geteuid())}); refusing to use it (it was left alone)")
    if info.st_mode & GROUP_OR_OTHER_WRITE:
        raise UnsafePathError(f"{what} {path} is writable by group or others (mode "
                              f"{stat.S_IMODE(info.st_mode):04o}); refusing to use it")


def open_owned(path: str, flags: int, what: str, mode: int = 0o600) -> int:
    """os.open without following a final symbolic link; the descriptor is checked with fstat."""
    if os.path.islink(path):  # O_CREAT on a link may fail with EACCES rather than ELOOP: say what it is
        raise UnsafePathError(f"{what} {path} is a symbolic link; refusing to follow it")
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(f"{what} {path} is a symbolic link; refusing to follow it") from exc
        raise UnsafePathError(f"cannot open {what} {path}: {exc.strerror}") from exc
    try:
        check_owned(os.fstat(fd), path, what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def foreign_reason(path: str) -> str | None:
    """Why ``path`` (not followed) is not our own regular file that only we may write; None if
    it is (or if it is gone)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    try:
        check_owned(info, path, "file")
    except UnsafePathError as exc:
        return str(exc)
    return None


def check_directory(path: str, what: str, must_be_ours: bool = False) -> None:
    """Raise unless names in ``path`` can only be made, renamed or removed by us (or root)."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise UnsafePathError(f"{what} {path}: {exc.strerror}") from exc
    if stat.S_ISLNK(info.st_mode):
        raise UnsafePathError(f"{what} {path} is a symbolic link; refusing to use it")
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafePathError(f"{what} {path} is not a directory")
    trusted = {os.geteuid()} if must_be_ours else {os.geteuid(), 0}
    if info.st_uid not in trusted:
        raise UnsafePathError(f"{what} {path} belongs to {describe_owner(info.st_uid)}, not to engramd's user "
                              f"({describe_owner(os.geteuid())}); another user could replace what engramd puts "
                              "there. Remove it or choose another path")
    sticky = bool(info.st_mode & stat.S_ISVTX)
    if info.st_mode & GROUP_OR_OTHER_WRITE and (must_be_ours or not sticky):
        raise UnsafePathError(f"{what} {path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):04o}"
                              f"{'' if sticky else ', no sticky bit'}); another user could replace what engramd "
                              "puts there. Use a directory only engramd's user may write")


def lock_holders(fd: int) -> list[int]:
    """Pids holding a lock on the file open at ``fd`` (from /proc/locks; empty if unknown)."""
    info = os.fstat(fd)
    wanted = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    pids = []
    try:
        with open("/proc/locks") as locks:
            for line in locks:
                fields = line.split()
                if len(fields) >= 6 and fields[-3] == wanted and fields[-4].isdigit():
                    pids.append(int(fields[-4]))
    except OSError:
        return []
    return sorted(set(pids))


def take_lock(path: str, what: str, busy: Callable[[], str]) -> int:
    """Open (creating) an owner-only lock file safely and hold an exclusive flock on it.

    ``busy()`` says what a held lock most likely means (called only then, once the file is
    known to be a safe regular one); the error adds who holds it."""
    fd = open_owned(path, os.O_RDWR | os.O_CREAT, what)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holders = lock_holders(fd)
        os.close(fd)
        who = ", ".join(f"pid {pid}" for pid in holders) or "a process this user cannot see"
        raise UnsafePathError(f"{what} {path} is locked by {who}: {busy()}") from exc
    return fd


def prepare_socket_dir(directory: str, default: bool) -> None:
    """Create the socket's directory 0700 if absent; otherwise check that no other user can
    swap the socket in it.  The default directory (under $TMPDIR) must be ours outright:
    anyone could have made it first."""
    try:
        os.makedirs(directory, mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UnsafePathError(f"cannot create the socket directory {directory}: {exc.strerror}") from exc
    check_directory(directory, "socket directory", must_be_ours=default)
