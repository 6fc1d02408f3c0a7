"""A small RLIMIT_NOFILE: refused at start, in words, or served with places the limit can carry.

A limit that leaves no room for the daemon's own descriptors and its peers stops it before
it serves; one that does is shared out (engramd/wire/places.py): no burst of connections, on
the ipc sockets or the TCP status socket, may run the daemon out of descriptors, and no user
may take the places of another.  Real limits (setrlimit in the child before exec), real
connections, real processes, and real second users.
"""
from __future__ import annotations

import grp
import os
import resource
import socket
import subprocess
import sys

import pytest

from engram_client.attach.connection import DaemonConnection
from engramd.guards.curve_keys import create_keys
from engramd.guards.fd_limits import MIN_NOFILE, OWN_FDS, PEER_SHARE, peer_budget
from engramd.wire.bounds import RESERVED_PLACES, USER_SHARE
from other_user import OtherUser, daemon_user, other_user  # noqa: F401  (fixtures)
from proc_stats import open_fds
from waiting import free_port, wait_for

RAW_PEER = __import__("raw_peer").__file__

PROCESS_TIMEOUT_S = 60


def _limit(n: int):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def _serve(endpoint: str, shm_dir: str, nofile: int, *extra: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "engramd", "serve", "--socket", endpoint, "--shm-dir", shm_dir,
                             "--no-progress", *extra], preexec_fn=_limit(nofile), **kwargs)


@pytest.mark.parametrize("nofile", [12, 24, MIN_NOFILE - 1])
def test_a_limit_too_low_to_serve_is_refused_in_words(socket_dir, shm_dir, nofile):
    proc = _serve(f"ipc://{socket_dir}/engramd.sock", shm_dir, nofile, stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        if proc.poll() is None:  # the old code served (and aborted at its 7th peer)
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr, stderr
    (line,) = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert f"RLIMIT_NOFILE) is {nofile}" in line and f"at least {MIN_NOFILE}" in line, line
    assert os.listdir(socket_dir) == [] and os.listdir(shm_dir) == []


# A ZMTP 3.0 DEALER's opening, NULL mechanism: the greeting, then a READY command naming its socket type.
GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
_READY_BODY = b"\x05READY" + b"\x0bSocket-Type" + (6).to_bytes(4, "big") + b"DEALER"
READY = bytes([0x04, len(_READY_BODY)]) + _READY_BODY


def _zmtp_peer(path: str) -> socket.socket:
    """A connection that completes the handshake and then stays, as an idle client does; returned
    once the daemon has greeted it (accepted), or has already shed it."""
    peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    peer.settimeout(30)
    peer.connect(path)
    try:
        peer.sendall(GREETING + READY)
        peer.recv(len(GREETING))
    except (ConnectionResetError, BrokenPipeError):
        pass  # accepted and shed already
    return peer


def _answers(connection: DaemonConnection) -> bool:
    try:
        return connection.request("status", timeout=5)["state"] == "ready"
    except Exception:
        return False


def test_at_the_lowest_limit_peers_past_the_cap_are_shed_and_the_daemon_lives(socket_dir, shm_dir):
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    cap = (MIN_NOFILE - OWN_FDS) // PEER_SHARE  # and RESERVED_PLACES more for root, as these peers are
    daemon = _serve(endpoint, shm_dir, MIN_NOFILE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    honest = DaemonConnection(endpoint)
    peers: list[socket.socket] = []
    try:
        wait_for(lambda: _answers(honest), "the daemon to serve its table", 60)
        at_rest = open_fds(daemon.pid)
        # More peers than the whole limit, held open, one at a time: each is accepted before the next,
        # and each past the cap must be shed (its descriptor closed).  (A burst: the next test.)
        for _ in range(MIN_NOFILE + cap):
            peers.append(_zmtp_peer(endpoint[len("ipc://"):]))
            wait_for(lambda: daemon.poll() is not None or open_fds(daemon.pid) <= at_rest + cap + RESERVED_PLACES,
                     "the daemon to shed the peers past its cap", 30)
            assert daemon.poll() is None, f"engramd exited with {daemon.returncode}"
        assert _answers(honest)
    finally:
        for peer in peers:
            peer.close()
        honest.close()
        daemon.terminate()
        daemon.wait(timeout=30)
    assert daemon.returncode == 0


def _stop(daemon: subprocess.Popen, *others: subprocess.Popen) -> None:
    for process in others:
        process.kill()
        process.wait(timeout=30)
    daemon.terminate()
    daemon.wait(timeout=30)


def test_a_burst_of_held_connections_at_the_lowest_limit_leaves_the_daemon_alive(socket_dir, shm_dir):
    """4 processes connecting as fast as the backlog lets them and holding on: libzmq accepted every
    connection, ran out of descriptors and aborted the daemon (3 runs of 3 at this limit)."""
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    daemon = _serve(endpoint, shm_dir, MIN_NOFILE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    flooders: list[subprocess.Popen] = []
    try:
        honest = DaemonConnection(endpoint)
        wait_for(lambda: _answers(honest), "the daemon to serve its table", 60)
        honest.close()
        flooders = [subprocess.Popen([sys.executable, RAW_PEER, "hold", endpoint[len("ipc://"):], "150", "0"],
                                     stdout=subprocess.PIPE, text=True) for _ in range(4)]
        opened = [int(flooder.stdout.readline().split()[0]) for flooder in flooders]  # then they hold them
        assert daemon.poll() is None, f"engramd exited with {daemon.returncode} after {sum(opened)} connections"
        late = DaemonConnection(endpoint)  # a place frees once the silent ones' handshake time runs out
        try:
            wait_for(lambda: _answers(late), "a new peer to be answered during the burst", 30)
        finally:
            late.close()
    finally:
        _stop(daemon, *flooders)
    assert daemon.returncode == 0


def test_tcp_connections_that_never_start_curve_cannot_run_the_daemon_out_of_descriptors(socket_dir, shm_dir,
                                                                                         tmp_path):
    """Plain TCP connections to --remote-status, no CURVE handshake: libzmq held each 30 s, uncounted, until
    they pinned every descriptor and the next ipc connection aborted the daemon."""
    keys = str(tmp_path / "keys")
    create_keys(keys)
    port, nofile = free_port(), 256
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    log_path = os.path.join(socket_dir, "engramd.log")
    with open(log_path, "wb") as log:
        daemon = _serve(endpoint, shm_dir, nofile, "--remote-status", f"tcp://127.0.0.1:{port}",
                        "--curve-keys-dir", keys, stdout=log, stderr=subprocess.STDOUT)
    honest = DaemonConnection(endpoint)
    plain: list[socket.socket] = []
    try:
        wait_for(lambda: _answers(honest), "the daemon to serve its table", 60)
        at_rest = open_fds(daemon.pid)
        for _ in range(2 * nofile):  # more than every descriptor the daemon has
            conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            conn.settimeout(5)
            try:
                conn.connect(("127.0.0.1", port))
            except OSError:
                conn.close()
                break
            plain.append(conn)
        late = DaemonConnection(endpoint)
        try:
            wait_for(lambda: daemon.poll() is not None or _answers(late), "a new ipc peer to be answered", 30)
        finally:
            late.close()
        assert daemon.poll() is None, open(log_path).read()[-3000:]
        share = min(64, peer_budget(nofile) // 4)  # the TCP status socket's places (server.py)
        wait_for(lambda: open_fds(daemon.pid) <= at_rest + share + 2, "the daemon to shed TCP peers past its share",
                 30)
        assert "refusing TCP status peers" in open(log_path).read()
    finally:
        for conn in plain:
            conn.close()
        honest.close()
        _stop(daemon)
    assert daemon.returncode == 0


def test_one_user_cannot_take_the_places_of_another(socket_dir, shm_dir, other_user, daemon_user):
    """A member of the daemon's group held every place with silent handshaken connections: another
    user's rank was refused, and root's status went unanswered."""
    group = grp.getgrgid(other_user.gid).gr_name
    second = OtherUser(daemon_user.name, daemon_user.uid, other_user.gid)  # another member of that group
    nofile = 160
    per_user = peer_budget(nofile) // USER_SHARE
    # The daemon gives G only a socket directory it creates itself (test_socket_dir_modes.py): the
    # members reach it through the test's own directory, which they may pass but not list.
    os.chmod(socket_dir, 0o711)
    endpoint = f"ipc://{socket_dir}/sockets/engramd.sock"
    path = endpoint[len("ipc://"):]
    daemon = _serve(endpoint, shm_dir, nofile, "--group", group, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL)
    with open(RAW_PEER) as f:
        raw_peer = f.read()
    holders: list[subprocess.Popen] = []
    try:
        honest = DaemonConnection(endpoint)
        wait_for(lambda: _answers(honest), "the daemon to serve its table", 60)
        honest.close()
        holders.append(other_user.spawn_python(raw_peer, "hold", path, str(peer_budget(nofile) + 8), "1"))
        opened, kept = map(int, holders[0].stdout.readline().split())
        assert kept == per_user, f"one user keeps {kept} of {opened} connections; its share is {per_user}"
        holders.append(second.spawn_python(raw_peer, "hold", path, str(per_user), "1"))
        opened, kept = map(int, holders[1].stdout.readline().split())
        assert kept == per_user, f"another user keeps {kept} of its {per_user} connections"
        status = subprocess.run([sys.executable, "-m", "engramd", "status", "--socket", endpoint, "--timeout", "10"],
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
    finally:
        _stop(daemon, *holders)
    assert daemon.returncode == 0
