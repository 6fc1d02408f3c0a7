"""Peers that try to take every lease, so that an honest rank cannot attach.

The hogs are real processes (tests/support/raw_peer.py run as a script, forking where it plays
many processes); leases are counted per connection, per process and per user as the
kernel names them (SO_PEERCRED), never by the ``pid`` a client writes in ``attach``.
"""
from __future__ import annotations

import grp
import os
import subprocess
import sys

from engram_client import EngramClient
from engram_client.core import endpoints, protocol
from other_user import other_user  # noqa: F401  (a fixture)

RAW_PEER = __import__("raw_peer").__file__


def hog(endpoint: str, processes: int, connections: int, attaches: int, host_chars: int = 8, user=None) -> int:
    """Leases granted to ``processes`` processes sending ``attaches`` attach requests on each of ``connections``."""
    args = [endpoints.ipc_path(endpoint), str(processes), str(connections), str(attaches), str(host_chars)]
    if user is None:
        result = subprocess.run([sys.executable, RAW_PEER, *args], capture_output=True, text=True, timeout=300)
        out, err, code = result.stdout, result.stderr, result.returncode
    else:
        with open(RAW_PEER) as f:
            process = user.spawn_python(f.read(), *args)
        out, err = process.communicate(timeout=300)
        code = process.returncode
    assert code == 0, err
    return int(out)


def test_one_process_cannot_take_every_lease(daemon_factory):
    """260 connections x 16 attaches from one process took all 4,096 leases in about a second."""
    daemon = daemon_factory("--lease-seconds", "120")
    daemon.wait_state("ready")
    assert hog(daemon.endpoint, 1, 260, 16) == 64
    assert daemon.status()["clients_total"] == 64
    with EngramClient(endpoint=daemon.endpoint, device="cpu", timeout=30) as client:
        assert client.attached
        assert daemon.status()["clients_total"] == 65


def test_one_users_processes_leave_leases_for_another_users_ranks(daemon_factory, other_user, socket_dir):
    """65 processes of one user, 64 leases each, would be every lease; a user gets 1,024."""
    group = grp.getgrgid(other_user.gid).gr_name
    os.chmod(socket_dir, 0o711)  # --group G re-modes only a socket directory the daemon creates: let G pass this one
    daemon = daemon_factory("--lease-seconds", "120", "--group", group)
    daemon.wait_state("ready")
    assert hog(daemon.endpoint, 65, 4, 16, user=other_user) == 1024
    with EngramClient(endpoint=daemon.endpoint, device="cpu", timeout=30) as client:  # root's rank
        assert client.attached
        assert daemon.status()["clients_total"] == 1025


def test_many_leases_leave_status_and_new_clients_working(daemon_factory):
    daemon = daemon_factory("--lease-seconds", "120")
    daemon.wait_state("ready")
    # 8 processes x 4 connections x 20 attaches: 16 per connection, so 64 per process, are granted.
    granted = hog(daemon.endpoint, 8, 4, 20, host_chars=230)
    assert granted == 8 * 4 * 16
    status = daemon.status()
    assert status["clients_total"] == granted
    assert len(protocol.pack(status)) < 32 * 1024
    cli = subprocess.run([sys.executable, "-m", "engramd", "status", "--socket", daemon.endpoint],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    with EngramClient(endpoint=daemon.endpoint, device="cpu", timeout=30) as client:
        assert client.refresh() is False
