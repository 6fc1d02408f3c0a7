"""A client whose daemon stops, and another user's real engramd then serving on the same path.

The socket lives in a shared sticky directory (as /tmp is), which the docs allow: another
user cannot replace the daemon's socket there, but may bind the same name once it is gone.
A client (root, auto_refresh=True) keeps looking up meanwhile; it must never talk to the
impostor, never map the impostor's table, and say why.
"""
from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import tempfile

import pytest
import torch

from engram_client import DaemonUnavailableError, EngramClient, TableFileError
from engram_client.core.demo_rows import demo_rows
from exactness import assert_bf16_exact
from other_user import daemon_site, other_user  # noqa: F401  (a fixture)
from waiting import wait_for

IMPOSTOR_SEED = 7  # other rows than the real daemon's (seed 0) under the same layout


@pytest.fixture
def impostor(other_user, socket_dir):
    """Starts `engramd serve` as the other user (its own shm dir, other rows); ends it afterwards."""
    site = daemon_site()
    shm = tempfile.mkdtemp(prefix="engt-imp-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.chown(shm, other_user.uid, other_user.gid)
    log_path = os.path.join(socket_dir, "impostor.log")
    started = []

    def start(endpoint: str) -> tuple[subprocess.Popen, str, str]:
        with open(log_path, "ab") as log:
            proc = other_user.serve(site, endpoint, shm, "--demo-seed", str(IMPOSTOR_SEED), output=log)
        started.append(proc)
        return proc, shm, log_path

    yield start
    for proc in started:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    shutil.rmtree(shm, ignore_errors=True)
    shutil.rmtree(site, ignore_errors=True)


def read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def check_real_rows(client: EngramClient) -> None:
    ids = torch.arange(0, 400, dtype=torch.int64)
    for layer in client.layers:
        assert_bf16_exact(client.table(layer).lookup(ids), *demo_rows(0, layer, ids.numpy(), 256))


def impostor_ready(proc: subprocess.Popen, log_path: str, socket_path: str, uid: int) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"the impostor engramd exited with {proc.returncode}:\n{read(log_path)}")
    return "state -> ready" in read(log_path) and os.path.exists(socket_path) and os.stat(socket_path).st_uid == uid


def test_a_client_never_follows_its_socket_to_another_users_daemon(daemon_factory, socket_dir, other_user,
                                                                   impostor, caplog):
    os.chmod(socket_dir, 0o1777)  # shared and sticky, like /tmp
    caplog.set_level(logging.INFO, logger="engram_client")
    real = daemon_factory("--lease-seconds", "1.5")  # heartbeats every 0.5 s
    real.wait_state("ready")
    socket_path = real.endpoint[len("ipc://"):]
    client = EngramClient(endpoint=real.endpoint, device="cpu", timeout=30, auto_refresh=True)
    try:
        table_path = client.table_path
        check_real_rows(client)
        real.connection.request("stop")
        assert real.proc.wait(timeout=30) == 0
        assert not os.path.exists(socket_path)

        proc, impostor_shm, impostor_log = impostor(real.endpoint)
        wait_for(lambda: impostor_ready(proc, impostor_log, socket_path, other_user.uid),
                 "the other user's engramd to serve on the same path", 60.0)
        refusal = f"socket of uid {other_user.uid}"
        wait_for(lambda: any(refusal in record.getMessage() for record in caplog.records) or client.refresh_pending
                 or "attached" in read(impostor_log), "the client's heartbeat to meet the other user's socket", 30.0)
        assert "attached" not in read(impostor_log), "the impostor granted this client a lease"
        assert not client.refresh_pending, "the client means to move to the impostor's table"
        for _ in range(5):  # lookups go on, from the real daemon's table, with auto_refresh on
            check_real_rows(client)
        assert client.table_path == table_path and not client.refresh_pending
        with pytest.raises(DaemonUnavailableError, match=refusal):
            client.refresh()
        with pytest.raises(DaemonUnavailableError, match=refusal):
            EngramClient(endpoint=real.endpoint, device="cpu", timeout=5)
        with open("/proc/self/maps") as maps:
            assert impostor_shm not in maps.read(), "the client mapped the impostor's table"
        assert "attached" not in read(impostor_log), "the impostor granted this client a lease"
        check_real_rows(client)
    finally:
        client.close()


def test_a_reply_from_another_users_process_is_refused_even_past_the_file_check(socket_dir, other_user,
                                                                                 impostor, monkeypatch):
    # The socket file is checked before connecting; in the moment between the check and the connect
    # the daemon's socket may go and another user's take its name.  A test cannot hit that moment by
    # chance, so the swap is made inside it: the real check runs on root's socket, then root's
    # socket goes, the other user's engramd binds the name, and only then does the client connect.
    import engram_client.attach.connection as connection_module

    os.chmod(socket_dir, 0o1777)
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    socket_path = endpoint[len("ipc://"):]
    roots = socket.socket(socket.AF_UNIX)
    roots.bind(socket_path)
    roots.listen()
    connection = connection_module.DaemonConnection(endpoint)
    real_check = connection_module.check_socket_trust
    swapped = []

    def check_then_swap(path: str):
        info = real_check(path)
        if not swapped:
            assert os.lstat(path).st_uid == 0, "the check did not see root's socket"
            roots.close()
            os.unlink(path)
            proc, _, impostor_log = impostor(endpoint)
            wait_for(lambda: impostor_ready(proc, impostor_log, socket_path, other_user.uid),
                     "the other user's engramd to serve on the same path", 60.0)
            swapped.append(proc)
        return info

    monkeypatch.setattr(connection_module, "check_socket_trust", check_then_swap)
    try:
        with pytest.raises(DaemonUnavailableError, match=f"uid {other_user.uid}, gid {other_user.gid}") as refused:
            connection.request("status", timeout=60)
        assert swapped and f"from pid {swapped[0].pid} " in str(refused.value), str(refused.value)
    finally:
        connection.close()
        roots.close()


def test_a_table_file_of_another_user_is_not_mapped(daemon_factory, other_user):
    daemon = daemon_factory()
    status = daemon.wait_state("ready")
    os.chown(status["table_path"], other_user.uid, other_user.gid)
    with pytest.raises(TableFileError, match=f"belongs to uid {other_user.uid}"):
        EngramClient(endpoint=daemon.endpoint, device="cpu", timeout=30)
    assert daemon.status()["clients"] == [], "the refused client's lease was not released"
