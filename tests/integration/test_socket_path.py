"""What ``engramd serve --socket ipc://PATH`` may replace at PATH: only a stale socket of its own.

Binding an ipc:// path replaces whatever stands there, and a stopping daemon removes its
socket file, so anything else given as ``--socket`` would be lost.  Real files, a real
listener of another program, and the stale socket a SIGKILLed daemon leaves.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from engramd.guards.safe_paths import same_file_at

PROCESS_TIMEOUT_S = 60


def serve(socket_path: str, shm_dir: str) -> subprocess.CompletedProcess:
    """``engramd serve`` expected to refuse at once (bounded, should it serve instead)."""
    return subprocess.run([sys.executable, "-m", "engramd", "serve", "--socket", f"ipc://{socket_path}",
                           "--shm-dir", shm_dir, "--no-progress"], capture_output=True, text=True,
                          timeout=PROCESS_TIMEOUT_S)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    return line


def _regular_file(path: str) -> None:
    with open(path, "w") as f:
        f.write("an operator's notes\n")


def _link_to_a_file(path: str) -> None:
    target = path + ".target"
    _regular_file(target)
    os.symlink(target, path)


@pytest.mark.parametrize("make, kind", [(_regular_file, "a regular file"), (os.mkfifo, "a FIFO"),
                                        (_link_to_a_file, "a symbolic link")])
@pytest.mark.parametrize("which", ["socket", "events socket"])
def test_serve_leaves_a_file_that_is_not_a_socket_alone(socket_dir, shm_dir, make, kind, which):
    socket_path = os.path.join(socket_dir, "engramd.sock")
    victim = socket_path if which == "socket" else socket_path + ".events"
    make(victim)
    before = os.lstat(victim)
    line = one_error_line(serve(socket_path, shm_dir))
    assert victim in line and kind in line, line
    after = os.lstat(victim)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode), "the file at --socket was replaced"
    if kind == "a regular file":
        assert open(victim).read() == "an operator's notes\n"
    planted = {os.path.basename(victim)} | ({os.path.basename(victim) + ".target"} if kind == "a symbolic link"
                                             else set())
    assert set(os.listdir(socket_dir)) == planted  # nothing of the daemon's is left behind either


def test_serve_does_not_take_over_a_socket_another_program_listens_on(socket_dir, shm_dir):
    socket_path = os.path.join(socket_dir, "engramd.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(4)
    try:
        line = one_error_line(serve(socket_path, shm_dir))
        assert socket_path in line and "listens on it" in line, line
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(socket_path)  # still the other program's socket
        client.close()
    finally:
        listener.close()


def test_serve_replaces_the_stale_socket_a_killed_daemon_left(daemon_factory):
    daemon = daemon_factory()
    daemon.wait_state("ready")
    daemon.kill()
    assert os.path.exists(daemon.endpoint[len("ipc://"):])  # SIGKILL leaves the socket file
    again = daemon_factory()
    assert again.wait_state("ready")["state"] == "ready"


def test_a_stopping_daemon_leaves_the_socket_file_that_took_its_place(daemon_factory):
    daemon = daemon_factory()
    daemon.wait_state("ready")
    path = daemon.endpoint[len("ipc://"):]
    os.unlink(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
        other.bind(path)  # another program's socket, where the daemon's was
        replacement = os.lstat(path)
        assert daemon.kill(signal.SIGTERM) == 0
        assert same_file_at(path, replacement), "the daemon removed a socket file it did not bind"


# ext4 gives a new file the inode of one just unlinked, so a replacement can carry the (st_dev, st_ino)
# the daemon recorded; its change time tells them apart.  A file system cannot be made to reuse an
# inode on demand (the daemon's own socket pins its inode while it runs), so the recorded lstat is a
# stand-in: the old file's change time with the new file's device and inode.  Both files are real.
def test_a_socket_file_with_the_inode_of_the_one_bound_but_another_ctime_is_not_it(socket_dir):
    path = os.path.join(socket_dir, "reused.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as first:
        first.bind(path)
        bound = os.lstat(path)
    os.unlink(path)
    # File times come from a coarse clock (one tick: at most 10 ms), so the next file's ctime is a
    # later one once a tick has passed.
    while time.time_ns() <= bound.st_ctime_ns + 20_000_000:
        time.sleep(0.005)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as second:
        second.bind(path)
        now = os.lstat(path)
        assert now.st_ctime_ns != bound.st_ctime_ns
        reused = SimpleNamespace(st_dev=now.st_dev, st_ino=now.st_ino, st_ctime_ns=bound.st_ctime_ns)
        assert same_file_at(path, now)
        assert not same_file_at(path, reused)
