"""Where a daemon keeps its table files and its served record inside the shm dir.

In an shm dir where only its owner may create names (a tmpfs of the daemon's own, the
Kubernetes example's ``/dev/shm/engramd`` of mode 0700), that is the shm dir itself.  In
one where others may create names too (``/dev/shm``, mode 1777), any name the daemon
would use can be taken first by another user: a planted ``*.table.partial`` would fail
every load, and a planted ``*.table`` or ``*.served``, which an unprivileged daemon
cannot rename over, the end of a load or the record a restart needs.  There the daemon
works in a directory of its own, that nobody else may write:

    <shm dir>/engramd-<instance>/                 0700, the daemon's user; with --group G
        engramd-<instance>-g<N>.table             0710 and group G: G's ranks may open a
        engramd-<instance>-g<N>.table.partial     table by its name, not list or add names
        engramd-<instance>.served
        engramd-<instance>.lock

If something else already holds that name, the daemon makes
``engramd-<instance>.<16 random hex digits>`` instead (``mkdir`` fails rather than reuse
a name that exists) and says so in the log.  The next start finds it again by its owner:
no other user can make a directory that belongs to the daemon's user, and none can
remove or rename one in a sticky directory.  The instance's lock file lives in it too
(shm/table_files.py): it tells which daemon owns an instance's files, and in the shm dir its
predictable name could be planted first, which stopped the daemon from starting.

Owns these directories; the files in them belong to shm/table_files.py and served_record.py.
"""
from __future__ import annotations

import logging
import os
import re
import secrets
import stat

from engram_client.core.errors import TableFileError

from ..guards.safe_paths import describe_owner, others_may_create_names

log = logging.getLogger("engramd.table_store")
_DIR_NAME = re.compile(r"^engramd-([0-9a-f]{12})(?:\.[0-9a-f]{16})?$")


def own_directories(shm_dir: str) -> list[tuple[str, str]]:
    """(instance, path) of every directory in ``shm_dir`` that a daemon of this user made, by name."""
    found = []
    for name in sorted(os.listdir(shm_dir)):
        match = _DIR_NAME.match(name)
        if match is None:
            continue
        path = os.path.join(shm_dir, name)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
            found.append((match.group(1), path))
    return found


def _make(path: str) -> bool:
    try:
        os.mkdir(path, 0o700)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        raise TableFileError(f"cannot create {path} for the table files: {exc.strerror}") from exc


def _taken_by(path: str) -> str:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "something that went away"
    kind = "a directory" if stat.S_ISDIR(info.st_mode) else "a symbolic link" if stat.S_ISLNK(info.st_mode) \
        else "a file"
    return f"{kind} of {describe_owner(info.st_uid)}"


def _claim(path: str, gid: int | None) -> None:
    """Give our directory the modes described above (a previous run may have had another --group)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise TableFileError(f"cannot open {path}, the directory of this daemon's table files: {exc.strerror}") \
            from exc
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise TableFileError(f"{path} belongs to {describe_owner(info.st_uid)}, not to engramd's user; "
                                 "refusing to keep table files there")
        if gid is not None:
            os.fchown(fd, -1, gid)
        os.fchmod(fd, 0o710 if gid is not None else 0o700)
    except OSError as exc:
        raise TableFileError(f"cannot set the owner and mode of {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)


def _make_fallback(taken: str) -> str:
    why = _taken_by(taken)
    for _ in range(8):  # 64 random bits: nobody can have guessed the name, so a collision means a bug
        chosen = f"{taken}.{secrets.token_hex(8)}"
        if _make(chosen):
            log.warning("%s is %s; this daemon keeps its table files in %s instead", taken, why, chosen)
            return chosen
    raise TableFileError(f"cannot create a directory for the table files beside {taken}: every name tried exists")


def files_directory(shm_dir: str, instance: str, gid: int | None = None) -> str:
    """The directory this instance's table files and served record go in (see above)."""
    if not others_may_create_names(shm_dir):
        return shm_dir
    mine = [path for owner, path in own_directories(shm_dir) if owner == instance]
    if mine:
        chosen = mine[0]  # the plain name sorts first; else the oldest fallback's name
    else:
        chosen = os.path.join(shm_dir, f"engramd-{instance}")
        if not _make(chosen):
            chosen = _make_fallback(chosen)
    _claim(chosen, gid)
    return chosen


def existing_files_directory(shm_dir: str, instance: str) -> str | None:
    """The directory ``files_directory`` would choose, if it exists already; never creates one."""
    try:
        if not others_may_create_names(shm_dir):
            return shm_dir
        mine = [path for owner, path in own_directories(shm_dir) if owner == instance]
    except OSError:
        return None
    return mine[0] if mine else None
