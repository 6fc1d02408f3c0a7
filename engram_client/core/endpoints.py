"""Where a daemon listens: the default request endpoint, ipc paths, and the events endpoint beside it.

Both the daemon (to bind) and the client and CLI (to connect) derive endpoints here,
so the two sides agree without configuration.  No sockets are opened here.
"""
from __future__ import annotations

import os
import stat
import tempfile

from .errors import ProtocolError
from .variables import SOCKET


def default_endpoint() -> str:
    """$ENGRAMD_SOCKET, else an ipc:// path in a per-user directory (created 0700)."""
    explicit = os.environ.get(SOCKET)
    if explicit:
        return explicit
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    base = os.path.join(runtime_dir, "engramd") if runtime_dir else os.path.join(
        tempfile.gettempdir(), f"engramd-{os.getuid()}")
    return "ipc://" + os.path.join(base, "engramd.sock")


def ipc_path(endpoint: str) -> str | None:
    return endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None


def pub_endpoint_for(endpoint: str) -> str:
    """The PUB endpoint that goes with a request endpoint: '<path>.events' for ipc."""
    path = ipc_path(endpoint)
    if path is not None:
        return f"ipc://{path}.events"
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint[len("tcp://"):].rpartition(":")
        if port.isdigit():
            return f"tcp://{host}:{int(port) + 1}"
    raise ProtocolError(f"cannot derive an events endpoint from {endpoint!r}; pass one explicitly")


def same_socket_file(info: os.stat_result, known: os.stat_result | None) -> bool:
    """Whether ``info``, an lstat of a socket path, shows the file ``known`` was taken of.

    The change time too: ext4 hands a new file the inode number of one just unlinked, so a daemon
    restarted after SIGKILL binds a socket file with the same (st_dev, st_ino) as the dead one's."""
    return known is not None and (info.st_dev, info.st_ino, info.st_ctime_ns) == \
        (known.st_dev, known.st_ino, known.st_ctime_ns)


def file_kind(info: os.stat_result) -> str:
    """What an lstat says stands at a path, in words ("a regular file"), for messages about
    something that should have been a socket."""
    for test, name in ((stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(info.st_mode):
            return name
    return "not a socket"
