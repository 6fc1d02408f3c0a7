"""Knowing at once that no engramd can be at an endpoint, without waiting for an answer.

A ZeroMQ connect to an ipc:// path that nothing listens on succeeds and then waits, so "no
daemon" would only show up as a timeout.  ``absent_reason`` looks at the socket file itself:
missing, not a socket, or a socket nothing accepts on (ECONNREFUSED, what a killed daemon
leaves) are known at once; a listening socket, or a tcp:// endpoint, may have a daemon.

Torch-free; the command line (engramd/cli/reach.py) and engine integrations use it.
"""
from __future__ import annotations

import errno
import os
import socket
import stat

from ..core.endpoints import ipc_path
from .socket_trust import not_a_socket

PROBE_TIMEOUT_S = 1.0
MISSING = "socket file missing"


def absent_reason(endpoint: str, probe: bool = True) -> str | None:
    """Why no daemon can be listening at ``endpoint``, or None if one may be (``probe`` False:
    only what the file at the path says, without connecting to a socket there)."""
    path = ipc_path(endpoint)
    if path is None:
        return None
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return MISSING
    except OSError:
        return None  # e.g. a directory we may not search: the connection explains that
    if not stat.S_ISSOCK(info.st_mode):
        return not_a_socket(path, info)
    if not probe:
        return None
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(PROBE_TIMEOUT_S)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        return f"socket file {path} is stale: nothing listens on it (a daemon that died leaves one)"
    except OSError as exc:
        if exc.errno in (errno.ENOENT,):
            return MISSING
        return None  # permission denied, a full backlog...: let the request say what happens
    finally:
        probe.close()
    return None

