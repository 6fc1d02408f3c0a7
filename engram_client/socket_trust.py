"""Whom a client trusts to be engramd: the owner of the socket it is about to talk through.

A client maps whatever table the daemon names, so talking to an impostor means reading
an impostor's rows.  Before connecting to an ``ipc://`` path the client checks that the
socket and its directory belong to root, to the client's own user, or to a group the
client is in (engramd's ``--group``), and that nobody else could have swapped the socket:
the directory is not writable by group or others unless it has the sticky bit.

Root may talk to a daemon of any user (an operator's ``engramd status`` and ``stop``): it
trusts a socket of any owner in a directory that only its owner may write, where nobody
but that owner (and root) can have made it.  In a directory others may write (a sticky
/tmp) root trusts only what the rule above trusts.  Every refusal is a SocketRefusedError.
"""
from __future__ import annotations

import os
import stat

from .core.errors import SocketRefusedError

_GROUP_OR_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _trusted(info: os.stat_result) -> bool:
    if info.st_uid in (0, os.geteuid()):
        return True
    return info.st_gid != 0 and info.st_gid in {os.getegid(), *os.getgroups()}


def _root_trusts_its_owner(dir_info: os.stat_result) -> bool:
    """Root, before a directory only its owner may write: whoever that is, the socket is theirs."""
    return os.geteuid() == 0 and not dir_info.st_mode & _GROUP_OR_OTHER_WRITE


def _owner(info: os.stat_result) -> str:
    return f"uid {info.st_uid}, gid {info.st_gid}"


def check_socket_trust(socket_path: str) -> None:
    """Raise SocketRefusedError if another user could be answering at ``socket_path``."""
    directory = os.path.dirname(socket_path) or "."
    try:
        dir_info = os.stat(directory)
    except OSError:
        return  # nothing there yet: connecting waits for a daemon, and this check runs again next time
    root_trusts = _root_trusts_its_owner(dir_info)
    if not (_trusted(dir_info) or root_trusts):
        raise SocketRefusedError(f"refusing to talk to engramd through {directory}: the directory belongs to "
                                 f"{_owner(dir_info)}, which is neither root, this user, nor a group of this "
                                 "user; another user could be posing as engramd there")
    writable_by_others = dir_info.st_mode & _GROUP_OR_OTHER_WRITE
    if writable_by_others and not dir_info.st_mode & stat.S_ISVTX:
        raise SocketRefusedError(f"refusing to talk to engramd through {directory}: the directory is writable "
                                 f"by group or others (mode {stat.S_IMODE(dir_info.st_mode):04o}) without the "
                                 "sticky bit, so anyone could replace the socket")
    try:
        sock_info = os.lstat(socket_path)
    except OSError:
        return
    if not stat.S_ISSOCK(sock_info.st_mode) or not (_trusted(sock_info) or root_trusts):
        kind = "socket" if stat.S_ISSOCK(sock_info.st_mode) else "non-socket file"
        raise SocketRefusedError(f"refusing to talk to engramd through {socket_path}: it is a {kind} of "
                                 f"{_owner(sock_info)}, which is neither root, this user, nor a group of this "
                                 "user; another user could be posing as engramd there")
