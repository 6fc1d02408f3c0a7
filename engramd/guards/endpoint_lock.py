"""The lock beside an ipc socket: binding would silently steal a live daemon's path, so a
second daemon on one endpoint is refused naming the first.

It also settles the socket's directory: the daemon gives ``--group``'s group and mode 0750
only to a directory it creates, never to one it found (``/tmp``, ``/run``, an operator's or
systemd's directory, or its default one left by a daemon killed before its stop: it cannot
tell who made that), since re-moding those could lock their other users out.  At the stop
it removes the one it created if it is empty then, and only where nobody else may create
names beside it: in a shared sticky parent (``/tmp``) the name would be free for any user to
take, and then to pose as engramd there or to keep the next start out, so it stays as the
name's keeper.
"""
from __future__ import annotations

import logging
import os

from engram_client.core import endpoints

from .lock_owner import holder, socket_lock_path, write_pid
from .safe_paths import (UnsafePathError, group_cannot_pass, others_may_create_names, prepare_socket_dir, release_lock,
                         remove_if_empty, take_lock)

log = logging.getLogger("engramd.server")


class EndpointLock:
    """An flock beside an ipc socket: binding would silently steal a live daemon's path."""

    def __init__(self, endpoint: str, gid: int | None = None):
        self.path = None
        self.fd = -1
        self.own_directory: str | None = None  # the socket directory, where this daemon created it
        socket_path = endpoints.ipc_path(endpoint)
        if socket_path is None:
            return
        directory = os.path.dirname(socket_path) or "."
        if prepare_socket_dir(directory, default=endpoint == endpoints.default_endpoint()):
            self.own_directory = directory
        self.path = socket_lock_path(socket_path)
        self.fd = take_lock(self.path, "socket lock", lambda: (
            f"another engramd{holder(self.path)} is serving {endpoint}; "
            f"stop it first: engramd stop --socket {endpoint}"))
        write_pid(self.fd)
        if gid is not None:
            try:
                self.open_to_group(directory, gid)
            except BaseException:
                self.release()
                raise

    def open_to_group(self, directory: str, gid: int) -> None:
        """Let ``--group``'s ranks through to the socket: a directory we created gets the group and
        mode 0750; one we found is left as it is, and the log says if the group cannot pass."""
        if directory == self.own_directory:
            try:
                os.chown(directory, -1, gid)
                os.chmod(directory, 0o750)
            except OSError as exc:
                raise UnsafePathError(f"cannot give the socket directory {directory} its group and mode: "
                                      f"{exc.strerror}") from exc
            return
        warn_if_group_cannot_pass(directory, gid)

    def release(self) -> None:
        if self.fd >= 0:
            release_lock(self.path, self.fd)
            self.fd = -1
            if self.own_directory is not None and self._name_is_ours_alone():
                remove_if_empty(self.own_directory)  # the sockets went before the lock: empty unless others use it

    def _name_is_ours_alone(self) -> bool:
        """Whether nobody else could take the socket directory's name once it is gone."""
        try:
            return not others_may_create_names(os.path.dirname(self.own_directory) or ".")
        except OSError:
            return False  # cannot tell: keep the directory


def warn_if_group_cannot_pass(directory: str, gid: int) -> None:
    """Log that ``--group``'s ranks will get "permission denied" at its socket."""
    reason = group_cannot_pass(directory, gid)
    if reason is not None:
        log.warning("--group: %s, so that group's ranks cannot reach the socket in it; engramd changes the group "
                    "and mode only of a socket directory it creates. Run: chgrp %d %s && chmod 0750 %s", reason,
                    gid, directory, directory)
