"""Whom a client trusts to be engramd: the owner of the socket it talks through, and of the table.

A client maps whatever table the daemon names, so talking to an impostor means reading
an impostor's rows.  Before connecting to an ``ipc://`` path the client checks that the
socket and its directory belong to root, to the client's own user, or to the daemon's user
the operator names: ``ENGRAMD_DAEMON_USER`` (a user name or a uid; unset, the account named
``engramd`` where one exists, as deploy/systemd makes it).  Never to a user merely because
the file's group is one of the client's: the daemon's ``--group`` lets its ranks in, and every
other member of that group could run an engramd of their own at the same path once the real
one is gone.  Nobody else may have swapped the socket either: the directory is not writable
by group or others unless it has the sticky bit.  In a sticky directory another user may
still bind the same name once the daemon is gone, so the connection checks again before
every (re)connect, and checks who sent each reply (connection.py).  The table file named in
an attach reply must belong to the same trusted owners, or to the owner of the socket the
client trusted (the daemon's user); that is checked on the opened descriptor (mapping.py),
never the name.

Root may talk to a daemon of any user (an operator's ``engramd status`` and ``stop``, a root
engine beside a daemon run as ``engramd``): it trusts a socket of any owner in a directory
that only its owner may write, where nobody but that owner (and root) can have made it.  In
a directory others may write (a sticky /tmp) root trusts only what the rule above trusts, so
an impostor there is refused.  Every refusal is a SocketRefusedError.
"""
from __future__ import annotations

import os
import pwd
import stat

from ..core.endpoints import file_kind
from ..core.errors import DaemonUnavailableError, SocketRefusedError, TableFileError
from ..core.variables import DAEMON_USER as DAEMON_USER_ENV

_GROUP_OR_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH
DEFAULT_DAEMON_USER = "engramd"  # the account deploy/systemd/engramd.service runs as


def named_daemon_uid() -> int | None:
    """The uid of the daemon's user the operator names (see above), or None where none is named."""
    named = os.environ.get(DAEMON_USER_ENV, "").strip()
    if named.isdigit():
        return int(named)
    try:
        return pwd.getpwnam(named or DEFAULT_DAEMON_USER).pw_uid
    except KeyError:
        if named:
            raise SocketRefusedError(f"{DAEMON_USER_ENV}={named!r} names no user of this machine; give the "
                                     "user name or uid engramd runs as") from None
        return None


def _trusted(info: os.stat_result) -> bool:
    return info.st_uid in (0, os.geteuid()) or info.st_uid == named_daemon_uid()


def _whom(info: os.stat_result) -> str:
    """Whom the file's owner is not, why that matters, and how an operator names the daemon's user."""
    named = os.environ.get(DAEMON_USER_ENV, "").strip()
    if named:
        daemon_user = f"{DAEMON_USER_ENV}={named}"
    elif named_daemon_uid() is not None:
        daemon_user = f"the account {DEFAULT_DAEMON_USER}, as no {DAEMON_USER_ENV} is set"
    else:
        daemon_user = f"no {DAEMON_USER_ENV} is set"
    return (f"which is neither root, this user (uid {os.geteuid()}), nor the daemon's user ({daemon_user}; "
            "a group in common does not count); another user could be posing as engramd there. If uid "
            f"{info.st_uid} is the user engramd runs as, say so: {DAEMON_USER_ENV}={info.st_uid}")


def _root_trusts_its_owner(dir_info: os.stat_result) -> bool:
    """Root, before a directory only its owner may write: whoever that is, the socket is theirs."""
    return os.geteuid() == 0 and not dir_info.st_mode & _GROUP_OR_OTHER_WRITE


def _owner(info: os.stat_result) -> str:
    return f"uid {info.st_uid}, gid {info.st_gid}"


def check_socket_trust(socket_path: str) -> os.stat_result | None:
    """Raise SocketRefusedError if another user could be answering at ``socket_path``; return
    the socket file's lstat, or None while there is none (the check must then run again)."""
    directory = os.path.dirname(socket_path) or "."
    try:
        dir_info = os.stat(directory)
    except OSError:
        return None  # nothing there yet: connecting waits for a daemon, and this check runs again next time
    root_trusts = _root_trusts_its_owner(dir_info)
    if not (_trusted(dir_info) or root_trusts):
        raise SocketRefusedError(f"refusing to talk to engramd through {directory}: the directory belongs to "
                                     f"{_owner(dir_info)}, {_whom(dir_info)}")
    writable_by_others = dir_info.st_mode & _GROUP_OR_OTHER_WRITE
    if writable_by_others and not dir_info.st_mode & stat.S_ISVTX:
        raise SocketRefusedError(f"refusing to talk to engramd through {directory}: the directory is writable "
                                     f"by group or others (mode {stat.S_IMODE(dir_info.st_mode):04o}) without the "
                                     "sticky bit, so anyone could replace the socket")
    try:
        sock_info = os.lstat(socket_path)
    except OSError:
        return None
    if stat.S_ISLNK(sock_info.st_mode):
        raise SocketRefusedError(f"refusing to talk to engramd through {socket_path}: it is a symbolic link, which "
                                 "could lead to any user's socket; give the path of the daemon's socket itself")
    if not stat.S_ISSOCK(sock_info.st_mode):  # nobody answers through it, whoever owns it
        raise DaemonUnavailableError(f"no engramd at ipc://{socket_path}: {not_a_socket(socket_path, sock_info)}")
    if not (_trusted(sock_info) or root_trusts):
        raise SocketRefusedError(f"refusing to talk to engramd through {socket_path}: it is a socket of "
                                 f"{_owner(sock_info)}, {_whom(sock_info)}")
    return sock_info


def not_a_socket(path: str, info: os.stat_result) -> str:
    """What to say of something other than a socket at the socket path: engramd serve says the same."""
    return (f"{path} is {file_kind(info)}, not a socket, so no engramd can answer there (engramd serve will not "
            "bind over it either): remove it, or give the daemon's socket")


def check_reply_sender(socket_path: str, peer_address: str | None, socket_file: os.stat_result | None,
                       op: str) -> None:
    """Raise SocketRefusedError unless a reply came from root, this user, or the owner of the
    socket file checked before connecting.  ``peer_address`` is libzmq's Peer-Address of the
    connection, "ADDRESS:UID:GID:PID" on ipc (SO_PEERCRED); without credentials in it the
    check of the socket file stands alone."""
    parts = (peer_address or "").rsplit(":", 3)
    if len(parts) != 4 or not all(part.isdigit() for part in parts[1:]):
        return
    uid, gid, pid = (int(part) for part in parts[1:])
    if uid in (0, os.geteuid()) or (socket_file is not None and uid == socket_file.st_uid):
        return
    owner = f"uid {socket_file.st_uid}" if socket_file is not None else "unknown"
    raise SocketRefusedError(f"refusing the reply to {op!r} at {socket_path}: it came from pid {pid} "
                                 f"(uid {uid}, gid {gid}), which is neither root, this user, nor the owner of "
                                 f"the socket file checked before connecting ({owner}); another user could be "
                                 "posing as engramd there")


def check_table_owner(path: str, info: os.stat_result, daemon_uid: int | None = None, kind: str = "table file",
                      error: type[Exception] = TableFileError) -> None:
    """Raise ``error`` unless ``info`` (fstat of the opened table file, or of another file the daemon
    publishes beside it: ``kind``) is a regular file of root, this user, the named daemon user, or
    ``daemon_uid`` (the owner of the socket file this client checked and talks through); never of a
    user only because its group is one of this user's."""
    if not stat.S_ISREG(info.st_mode):
        raise error(f"refusing to map {path}: it is not a regular file")
    if not (_trusted(info) or (daemon_uid is not None and info.st_uid == daemon_uid)):
        raise error(f"refusing to map {path}: the {kind} belongs to {_owner(info)}, which is neither "
                    "root, this user, the daemon's user, nor the owner of the socket this client talks "
                    f"through; another user's file is not engramd's {kind}")
