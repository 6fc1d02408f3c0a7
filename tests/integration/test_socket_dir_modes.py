"""What ``engramd serve --group G`` does to its socket's directory: only its own is changed or removed.

A directory the daemon found (a shared sticky one like /tmp, an operator's 0700 one) keeps
its owner, group and mode, during the serve and after the stop: re-moding /tmp to 0750 locked
every other user out of it.  A directory the daemon created gets G and 0750, and goes at the
stop once it is empty, unless others may create names beside it (then it keeps the name).
Real daemons as root; G is the group of a second user made for the test.
"""
from __future__ import annotations

import os
import stat

import pytest

from engram_client.attach.connection import DaemonConnection
from engram_client.tools.serve_process import launch_serve
from other_user import other_user  # noqa: F401  (a fixture)
from waiting import end_process, wait_for


def serve_until_stopped(endpoint: str, shm_dir: str, log_path: str, group: str, while_serving) -> str:
    """Serve ``endpoint`` with ``--group group``, call ``while_serving()`` once it is ready, stop it; its log."""
    with open(log_path, "ab") as log:
        proc = launch_serve(endpoint, shm_dir, "--group", group, log_level="info", output=log)
    connection = DaemonConnection(endpoint)
    try:
        wait_for(lambda: proc.poll() is not None or "state -> ready" in read(log_path), "the daemon to serve", 60)
        assert proc.poll() is None, read(log_path)
        while_serving()
        connection.request("stop", timeout=30)
        assert proc.wait(timeout=60) == 0, read(log_path)
    finally:
        connection.close()
        end_process(proc)
    return read(log_path)


def read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def mode_and_owner(path: str) -> tuple[int, int, int]:
    info = os.stat(path)
    return stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid


@pytest.mark.parametrize("mode", [0o1777, 0o700], ids=["shared-sticky", "operators-own"])
def test_a_directory_the_daemon_found_keeps_its_group_and_mode(socket_dir, shm_dir, other_user, tmp_path, mode):
    os.chmod(socket_dir, mode)
    before = mode_and_owner(socket_dir)
    endpoint = f"ipc://{socket_dir}/engramd.sock"

    def while_serving():
        assert mode_and_owner(socket_dir) == before, "the daemon re-moded a directory it did not create"
        socket_mode, _, socket_gid = mode_and_owner(endpoint[len("ipc://"):])
        assert (socket_mode, socket_gid) == (0o660, other_user.gid)

    log = serve_until_stopped(endpoint, shm_dir, str(tmp_path / "daemon.log"), other_user.name, while_serving)
    assert os.path.isdir(socket_dir) and mode_and_owner(socket_dir) == before
    if mode == 0o700:  # the group cannot pass this one: the log says so and what to run
        assert f"chgrp {other_user.gid} {socket_dir} && chmod 0750 {socket_dir}" in log, log
    else:
        assert "cannot reach the socket" not in log, log


@pytest.mark.parametrize("parent_mode", [0o755, 0o1777], ids=["private-parent", "shared-sticky-parent"])
def test_a_directory_the_daemon_created_gets_the_group_and_goes_at_the_stop(socket_dir, shm_dir, other_user,
                                                                            tmp_path, parent_mode):
    parent = os.path.join(socket_dir, "run")
    os.mkdir(parent)
    os.chmod(parent, parent_mode)
    created = os.path.join(parent, "engramd")
    endpoint = f"ipc://{created}/engramd.sock"

    def while_serving():
        assert mode_and_owner(created) == (0o750, 0, other_user.gid)

    serve_until_stopped(endpoint, shm_dir, str(tmp_path / "daemon.log"), other_user.name, while_serving)
    if parent_mode == 0o755:
        assert not os.path.exists(created), "the socket directory serve created was left after the stop"
    else:  # in /tmp its name would be anyone's to take, and to pose as engramd through: it stays, empty
        assert os.listdir(created) == [] and mode_and_owner(created) == (0o750, 0, other_user.gid)
    assert mode_and_owner(parent) == (parent_mode, 0, 0)
