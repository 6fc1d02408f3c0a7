"""Opening and binding only through paths the daemon's own user controls.

The daemon often runs as root with its table files in /dev/shm (mode 1777), where any
local user may create names.  So before it reads, locks or binds anything there it checks:

- files are opened with ``O_NOFOLLOW`` and checked on the open descriptor (``fstat``):
  a regular file, owned by the daemon's effective uid, not writable by group or others;
- directories are not symbolic links, and are owned by the daemon's user (or root) and
  not writable by group or others, unless the sticky bit is set: then others may create
  names there but cannot rename or remove ours;
- a file lock held by someone else is reported with the holder's pid (from /proc/locks)
  and the file's owner; a lock is good only while its file is still the one at the path;
- a socket is bound only where nothing stands but a stale socket of the daemon's own user
  (binding an ipc:// path replaces whatever is there);
- ``--group G`` is taken only if this process may give its files to G.

Every refusal raises UnsafePathError naming the path, what is wrong and whose it is.
Owns no files; callers decide what to do with what it opens.
"""
from __future__ import annotations

import errno
import fcntl
import os
import pwd
import socket
import stat
from typing import Callable

from engram_client.core.endpoints import file_kind, same_socket_file
from engram_client.core.errors import ConfigError

from .lock_owner import lock_holders_of

GROUP_OR_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH
LOCK_ATTEMPTS = 8


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


def check_directory(path: str, what: str, must_be_ours: bool = False, sticky_ok: bool = True) -> None:
    """Raise unless names in ``path`` can only be made, renamed or removed by us (or root); a
    directory others may write is taken with the sticky bit (others' names cannot replace
    ours there) unless ``sticky_ok`` is False (every name in it counts, as keys do)."""
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
    if info.st_mode & GROUP_OR_OTHER_WRITE and (must_be_ours or not sticky_ok or not sticky):
        raise UnsafePathError(f"{what} {path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):04o}"
                              f"{'' if sticky else ', no sticky bit'}); another user could replace what engramd "
                              "puts there. Use a directory only engramd's user may write")


def lock_holders(fd: int) -> list[int]:
    """Pids holding a lock on the file open at ``fd`` (from /proc/locks; empty if unknown)."""
    return lock_holders_of(os.fstat(fd))


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def take_lock(path: str, what: str, busy: Callable[[], str]) -> int:
    """Open (creating) an owner-only lock file safely and hold an exclusive flock on it.

    A stopping daemon unlinks its lock file while it still holds it, then lets go.  A
    starter that opened the old file just before may win the flock on that deleted inode,
    and a third start would then lock a fresh file at the same path: two daemons on one
    socket.  So once locked, the file must still be the one at ``path``; if it is not, the
    lock is worth nothing and is taken again on what the path holds now.

    ``busy()`` says what a held lock most likely means (called only then, once the file is
    known to be a safe regular one); the error adds who holds it."""
    for _ in range(LOCK_ATTEMPTS):
        fd = open_owned(path, os.O_RDWR | os.O_CREAT, what)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holders = lock_holders(fd)
            os.close(fd)
            who = ", ".join(f"pid {pid}" for pid in holders) or "a process this user cannot see"
            raise UnsafePathError(f"{what} {path} is locked by {who}: {busy()}") from exc
        try:
            current = os.lstat(path)
        except FileNotFoundError:
            current = None
        if current is not None and _same_file(current, os.fstat(fd)):
            return fd
        os.close(fd)  # locked a file its holder had just unlinked on its way out: take the new one
    raise UnsafePathError(f"{what} {path} keeps being replaced while engramd locks it ({LOCK_ATTEMPTS} attempts); "
                          "is another engramd starting and stopping on the same path?")


def release_lock(path: str, fd: int) -> None:
    """Unlink ``path`` while still holding its lock (see take_lock), then let go.  Only our own
    file is unlinked: if the path now names another file, that one is someone else's."""
    try:
        if _same_file(os.lstat(path), os.fstat(fd)):
            os.unlink(path)
    except FileNotFoundError:
        pass
    os.close(fd)


def prepare_socket_dir(directory: str, default: bool) -> bool:
    """Create the socket's directory 0700 if absent; otherwise check that no other user can
    swap the socket in it.  The default directory (under $TMPDIR) must be ours outright:
    anyone could have made it first.  Returns whether this call created it."""
    try:
        os.makedirs(directory, mode=0o700)
        created = True
    except FileExistsError:
        created = False
    except OSError as exc:
        raise UnsafePathError(f"cannot create the socket directory {directory}: {exc.strerror}") from exc
    check_directory(directory, "socket directory", must_be_ours=default)
    return created


def group_cannot_pass(directory: str, gid: int) -> str | None:
    """Why members of group ``gid`` cannot reach a socket inside ``directory`` (they need its
    search bit, as its group or as others), or None if they can."""
    info = os.stat(directory)
    if info.st_mode & stat.S_IXOTH or (info.st_gid == gid and info.st_mode & stat.S_IXGRP):
        return None
    return (f"{directory} (mode {stat.S_IMODE(info.st_mode):04o}, gid {info.st_gid}) does not let members of "
            f"gid {gid} through")


def others_may_create_names(directory: str) -> bool:
    """Whether users other than the directory's owner may add names to it (sticky or not)."""
    return bool(os.lstat(directory).st_mode & GROUP_OR_OTHER_WRITE)


def remove_if_empty(path: str) -> None:
    """Tidy away a directory of ours at a stop that left nothing in it (rmdir: never its contents)."""
    try:
        os.rmdir(path)
    except OSError:
        pass


def check_bind_path(path: str, what: str) -> None:
    """Raise unless binding ``path`` would replace nothing but a stale socket of ours.

    libzmq unlinks whatever is at an ipc:// path before it binds, and the daemon unlinks its
    socket when it stops, so a regular file (or anything else) given as ``--socket`` would be
    lost.  A socket of ours that nothing listens on is what a daemon killed with SIGKILL leaves:
    that one may go.  The endpoint's lock is held when this runs, so no engramd of this
    endpoint is binding it meanwhile."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UnsafePathError(f"{what} {path}: {exc.strerror}") from exc
    if not stat.S_ISSOCK(info.st_mode):
        raise UnsafePathError(f"{what} {path} is {file_kind(info)}, not a socket; binding there would replace it, so "
                              "engramd leaves it alone. Remove it yourself or choose another path")
    if info.st_uid != os.geteuid():
        raise UnsafePathError(f"{what} {path} is a socket of {describe_owner(info.st_uid)}, not of engramd's user "
                              f"({describe_owner(os.geteuid())}); refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        return  # stale: nothing listens on it any more
    except OSError as exc:
        raise UnsafePathError(f"{what} {path}: cannot tell whether something still listens on it "
                              f"({exc.strerror}); refusing to replace it") from exc
    finally:
        probe.close()
    raise UnsafePathError(f"{what} {path}: something this user runs listens on it, and it is not an engramd "
                          "of this endpoint (that one would hold the endpoint's lock); refusing to take its place")


def same_file_at(path: str, identity: os.stat_result | None) -> bool:
    """Whether ``path`` (not followed) is still the socket file ``identity`` is an lstat of: device,
    inode and change time, as a client tells a restarted daemon's socket (same_socket_file)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    return same_socket_file(info, identity)


def _may_chown() -> bool:
    """Whether this process has CAP_CHOWN in effect (root usually; not in a unit without capabilities)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & 1)  # bit 0 is CAP_CHOWN
    except (OSError, ValueError, IndexError):
        pass
    return os.geteuid() == 0


def check_group_usable(group: str, gid: int) -> None:
    """Raise unless this process may give its socket and table files to group ``gid``: chown(2)
    to a group needs membership in it or CAP_CHOWN."""
    if gid in {os.getegid(), *os.getgroups()} or _may_chown():
        return
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = f"uid {os.geteuid()}"
    raise UnsafePathError(f"--group {group}: engramd's user {user} is not in group {group} (gid {gid}), so it "
                          f"cannot give its socket and table to that group; add it (usermod -aG {group} {user}) "
                          "or choose a group it is in")
