"""The lock beside an ipc socket: binding would silently steal a live daemon's path, so a
second daemon on one endpoint is refused naming the first."""
from __future__ import annotations

import os

from engram_client.core import endpoints

from .lock_owner import holder, socket_lock_path, write_pid
from .safe_paths import prepare_socket_dir, release_lock, take_lock


class EndpointLock:
    """An flock beside an ipc socket: binding would silently steal a live daemon's path."""

    def __init__(self, endpoint: str):
        self.path = None
        self.fd = -1
        socket_path = endpoints.ipc_path(endpoint)
        if socket_path is None:
            return
        directory = os.path.dirname(socket_path) or "."
        prepare_socket_dir(directory, default=endpoint == endpoints.default_endpoint())
        self.path = socket_lock_path(socket_path)
        self.fd = take_lock(self.path, "socket lock", lambda: (
            f"another engramd{holder(self.path)} is serving {endpoint}; "
            f"stop it first: engramd stop --socket {endpoint}"))
        write_pid(self.fd)

    def release(self) -> None:
        if self.fd >= 0:
            release_lock(self.path, self.fd)
            self.fd = -1
