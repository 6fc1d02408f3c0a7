"""A small RLIMIT_NOFILE: refused at start, in words, or served with a peer cap the limit can carry.

libzmq aborts the whole process when accept(2) fails with EMFILE, so a limit that leaves
no room for the daemon's own descriptors and its peers must stop it before it serves.
Real limits (setrlimit in the child before exec) and real connections.
"""
from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys

import pytest

from engram_client.attach.connection import DaemonConnection
from engramd.guards.fd_limits import MIN_NOFILE, OWN_FDS, PEER_SHARE
from waiting import wait_for

PROCESS_TIMEOUT_S = 60


def _limit(n: int):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def _serve(endpoint: str, shm_dir: str, nofile: int, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "engramd", "serve", "--socket", endpoint, "--shm-dir", shm_dir,
                             "--no-progress"], preexec_fn=_limit(nofile), **kwargs)


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


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _answers(connection: DaemonConnection) -> bool:
    try:
        return connection.request("status", timeout=5)["state"] == "ready"
    except Exception:
        return False


def test_at_the_lowest_limit_peers_past_the_cap_are_shed_and_the_daemon_lives(socket_dir, shm_dir):
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    cap = (MIN_NOFILE - OWN_FDS) // PEER_SHARE
    daemon = _serve(endpoint, shm_dir, MIN_NOFILE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    honest = DaemonConnection(endpoint)
    peers: list[socket.socket] = []
    try:
        wait_for(lambda: _answers(honest), "the daemon to serve its table", 60)
        at_rest = _fds(daemon.pid)
        # More peers than the whole limit, held open, one at a time: each is accepted before the next,
        # and each past the cap must be shed (its descriptor closed), or the daemon would run out and
        # libzmq abort it.  (A burst faster than the daemon sheds is the headroom's business.)
        for _ in range(MIN_NOFILE + cap):
            peers.append(_zmtp_peer(endpoint[len("ipc://"):]))
            wait_for(lambda: daemon.poll() is not None or _fds(daemon.pid) <= at_rest + cap,
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
