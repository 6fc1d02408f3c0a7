"""Another local user against a daemon run as root in a shared (mode 1777) directory.

Each test reproduces one attack of a second, unprivileged user (created for the test) and
checks that the daemon neither adopts, opens nor binds through anything that user owns,
and says so clearly.
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile

import pytest

from engram_client.attach.connection import DaemonConnection
from engram_client.core.errors import DaemonUnavailableError
from engramd.shm.table_files import instance_id
from other_user import other_user  # noqa: F401  (a fixture)


@pytest.fixture
def shared_shm(shm_dir):
    """The shm dir as /dev/shm is on most hosts: world-writable with the sticky bit."""
    os.chmod(shm_dir, 0o1777)
    return shm_dir


def test_a_table_planted_by_another_user_is_not_adopted_nor_removed(daemon_factory, shared_shm, other_user):
    daemon = daemon_factory()
    served = daemon.wait_state("ready")
    ours = served["table_path"]
    # The planter copies a complete, matching table (same fingerprint and layout) under a newer generation.
    source = os.path.join(shared_shm, "copy-for-the-planter")  # somewhere the other user can read
    with open(ours, "rb") as f, open(source, "wb") as out:
        out.write(f.read())
    os.chmod(source, 0o644)
    planted = os.path.join(shared_shm, f"engramd-{instance_id(daemon.endpoint)}-g99.table")
    daemon.kill()
    other_user.run("cp", source, planted)
    assert os.stat(planted).st_uid == other_user.uid

    again = daemon_factory(name="engramd")
    status = again.wait_state("ready")
    assert status["generation"] != 99 and status["table_path"] != planted
    assert os.stat(status["table_path"]).st_uid == os.geteuid()
    assert f"not re-adopting {planted}" in again.log() and f"uid {other_user.uid}" in again.log()
    assert os.path.exists(planted), "another user's file was unlinked"


def planted_lock_name(where: str, socket_dir: str, shared_shm: str) -> str:
    """Where a lock's name can be worked out and planted: the shm dir's instance lock (which now
    lives in the daemon's own directory, so the name planted in the shm dir is only a name), or the
    socket's lock in a shared sticky socket directory (which still guards that path)."""
    if where == "socket":
        os.chmod(socket_dir, 0o1777)
        return os.path.join(socket_dir, "engramd.sock.lock")
    return os.path.join(shared_shm, f"engramd-{instance_id(f'ipc://{socket_dir}/engramd.sock')}.lock")


@pytest.mark.parametrize("where", ["shm", "socket"])
def test_lock_file_symlink_is_not_followed(daemon_factory, socket_dir, shared_shm, other_user, tmp_path, where):
    victim = tmp_path / "victim"
    victim.write_text("root's data\n")
    lock = planted_lock_name(where, socket_dir, shared_shm)
    other_user.run("ln", "-s", str(victim), lock)
    daemon = daemon_factory()
    if where == "shm":
        daemon.wait_state("ready")
    else:
        assert daemon.proc.wait(timeout=60) == 1
        assert lock in daemon.log() and "symbolic link" in daemon.log()
    assert victim.read_text() == "root's data\n", "the lock file's symlink was followed"
    assert os.path.islink(lock)


@pytest.mark.parametrize("where", ["shm", "socket"])
def test_lock_file_held_by_another_user_names_the_holder(daemon_factory, socket_dir, shared_shm, other_user, where):
    lock = planted_lock_name(where, socket_dir, shared_shm)
    holder = other_user.spawn_python(
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)\n"
        "fcntl.flock(fd, fcntl.LOCK_SH)\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n", lock)
    try:
        assert holder.stdout.readline().strip() == "held"
        daemon = daemon_factory()
        if where == "shm":  # the name in the shm dir is not the daemon's lock: it serves
            assert daemon.wait_state("ready")["table_path"]
            assert os.stat(lock).st_uid == other_user.uid
        else:
            assert daemon.proc.wait(timeout=60) == 1
            log = daemon.log()
            assert lock in log and (f"uid {other_user.uid}" in log or f"pid {holder.pid}" in log), log
    finally:
        holder.kill()
        holder.wait(timeout=30)


def _serve_default_socket(env: dict, shm_dir: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "engramd", "serve", "--shm-dir", shm_dir, "--no-progress"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_default_socket_dir_precreated_by_another_user_is_refused(shm_dir, other_user):
    base = tempfile.mkdtemp(prefix="engt-tmp-")
    os.chmod(base, 0o1777)
    try:
        planted = os.path.join(base, f"engramd-{os.getuid()}")
        other_user.run("mkdir", "-m", "0777", planted)
        env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "ENGRAMD_SOCKET")}
        env["TMPDIR"] = base
        proc = _serve_default_socket(env, shm_dir)
        try:
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        assert proc.returncode == 1, out
        assert planted in out and f"uid {other_user.uid}" in out, out
        assert not os.path.exists(os.path.join(planted, "engramd.sock"))
    finally:
        subprocess.run(["rm", "-rf", base], timeout=60)


def test_socket_dir_writable_by_others_is_refused(shm_dir):
    base = tempfile.mkdtemp(prefix="engt-open-")
    os.chmod(base, 0o777)  # world-writable without the sticky bit: anyone can replace the socket
    try:
        proc = subprocess.run([sys.executable, "-m", "engramd", "serve", "--shm-dir", shm_dir, "--no-progress",
                               "--socket", f"ipc://{base}/engramd.sock"], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 1 and base in proc.stderr + proc.stdout and "writable" in proc.stderr + proc.stdout
    finally:
        subprocess.run(["rm", "-rf", base], timeout=60)


def test_client_refuses_a_socket_dir_another_user_controls(other_user):
    base = tempfile.mkdtemp(prefix="engt-cli-")
    os.chmod(base, 0o1777)
    try:
        planted = os.path.join(base, "sockets")
        other_user.run("mkdir", "-m", "0777", planted)
        with pytest.raises(DaemonUnavailableError, match=f"uid {other_user.uid}"):
            DaemonConnection(f"ipc://{planted}/engramd.sock")
    finally:
        subprocess.run(["rm", "-rf", base], timeout=60)


def test_client_refuses_a_socket_another_user_bound(other_user):
    base = tempfile.mkdtemp(prefix="engt-cli-")
    os.chmod(base, 0o1777)  # like /tmp: others may create names here, but a client must not trust them
    try:
        sock = os.path.join(base, "engramd.sock")
        binder = other_user.spawn_python(  # what libzmq's ipc bind makes: a listening unix socket
            "import socket, sys, time\n"
            "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()\n"
            "print('bound', flush=True); time.sleep(120)\n", sock)
        try:
            assert binder.stdout.readline().strip() == "bound"
            assert stat.S_ISSOCK(os.stat(sock).st_mode)
            with pytest.raises(DaemonUnavailableError, match=f"uid {other_user.uid}"):
                DaemonConnection(f"ipc://{sock}")
        finally:
            binder.kill()
            binder.wait(timeout=30)
    finally:
        subprocess.run(["rm", "-rf", base], timeout=60)
