"""A daemon run by another local user: root operating it, a group it is not in, refusals' exit code.

The daemon here is a real ``engramd serve`` running as a second user created for the test
(tests/support/engramd_as.py); the operator is this process's user, root.
"""
from __future__ import annotations

import grp
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

from engramd_as import run_engramd, spawn_engramd
from other_user import other_user  # noqa: F401  (a fixture)
from waiting import wait_for

EXIT_REFUSED = 4
PROCESS_TIMEOUT_S = 60


def engramd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engramd", *args], capture_output=True, text=True,
                          timeout=PROCESS_TIMEOUT_S)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


@pytest.fixture
def user_dirs(other_user):
    """A socket dir and an shm dir that belong to the other user, mode 0700, as its unit would make them."""
    made = [tempfile.mkdtemp(prefix="engt-"), tempfile.mkdtemp(prefix="engt-", dir="/dev/shm")]
    for path in made:
        os.chown(path, other_user.uid, other_user.gid)
        os.chmod(path, 0o700)
    yield made
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def users_daemon(other_user, user_dirs, tmp_path):
    socket_dir, shm = user_dirs
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    log_path = tmp_path / "daemon.log"
    with open(log_path, "wb") as log:
        proc = spawn_engramd(other_user, "serve", "--socket", endpoint, "--shm-dir", shm, "--no-progress",
                             "--log-level", "info", output=log)
    try:
        # Watched through its log: on the old code root could not ask it.
        wait_for(lambda: proc.poll() is not None or "state -> ready" in log_path.read_text(),
                 "the other user's daemon to serve its table", 60)
        assert proc.poll() is None, log_path.read_text()
        yield endpoint, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)


def test_root_reads_the_status_of_another_users_daemon(users_daemon, other_user):
    endpoint, proc = users_daemon
    result = engramd("status", "--socket", endpoint, "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["state"] == "ready" and status["pid"] == proc.pid
    assert os.stat(status["table_path"]).st_uid == other_user.uid


def test_a_root_engine_looks_rows_up_from_another_users_daemon(users_daemon, other_user):
    """Root trusts an owner-only socket directory's owner, so it maps that owner's table too."""
    import numpy as np
    import torch

    from engram_client import EngramClient
    from engram_client.core.demo_rows import demo_rows
    from exactness import assert_bf16_exact

    endpoint, _ = users_daemon
    with EngramClient(endpoint=endpoint, device="cpu", timeout=30.0) as client:
        assert os.stat(client._state.mapped.path).st_uid == other_user.uid
        layer = client.layers[0]
        table = client.table(layer)
        ids = np.arange(0, 64, dtype=np.int64)
        assert_bf16_exact(table.lookup(torch.from_numpy(ids)), *demo_rows(0, layer, ids, table.head_dim))
        assert client._state.connection.daemon_uid == other_user.uid


def test_root_stops_another_users_daemon(users_daemon):
    endpoint, proc = users_daemon
    result = engramd("stop", "--socket", endpoint)
    assert result.returncode == 0, result.stderr
    assert "engramd stopped" in result.stdout
    assert proc.poll() is not None  # stop returned once the process was gone
    assert proc.wait(timeout=30) == 0
    assert not os.path.exists(endpoint[len("ipc://"):])


def test_a_socket_root_must_not_trust_is_refused_with_its_own_exit_code(other_user):
    """In a sticky shared directory anyone may bind a socket: root trusts only its own there."""
    base = tempfile.mkdtemp(prefix="engt-shared-")
    os.chmod(base, 0o1777)
    path = os.path.join(base, "engramd.sock")
    binder = other_user.spawn_python(
        "import socket, sys, time\n"
        "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()\n"
        "print('bound', flush=True); time.sleep(120)\n", path)
    try:
        assert binder.stdout.readline().strip() == "bound"
        for command in (["status"], ["status", "--json"], ["stop"]):
            result = engramd(*command, "--socket", f"ipc://{path}")
            assert result.returncode == EXIT_REFUSED, (command, result.returncode, result.stderr)
            (line,) = error_lines(result.stderr)
            assert path in line and f"uid {other_user.uid}" in line, line
            if "--json" in command:
                assert json.loads(result.stdout)["state"] == "refused"
    finally:
        binder.kill()
        binder.wait(timeout=30)
        subprocess.run(["rm", "-rf", base], timeout=60)


def _a_group_not_of(uid: int, gid: int) -> grp.struct_group:
    import pwd
    name = pwd.getpwuid(uid).pw_name
    for group in grp.getgrall():
        if group.gr_gid not in (0, gid) and name not in group.gr_mem:
            return group
    pytest.skip("no group on this machine that the other user is not in")


def test_a_group_the_daemons_user_is_not_in_is_refused_before_binding(other_user, user_dirs):
    socket_dir, shm = user_dirs
    group = _a_group_not_of(other_user.uid, other_user.gid)
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    # On the old code this never returned: chown failed after the bind and the context waited forever.
    result = run_engramd(other_user, "serve", "--socket", endpoint, "--shm-dir", shm, "--no-progress",
                         "--group", group.gr_name, timeout=PROCESS_TIMEOUT_S)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = error_lines(result.stderr)
    assert f"--group {group.gr_name}" in line and "not in group" in line, line
    assert os.listdir(socket_dir) == [] and os.listdir(shm) == []


# The failure after the bind cannot be produced for real any more (the group is checked first),
# so chown(2) is made to fail in the daemon process itself: what is under test is that the
# already bound socket is closed and removed, and the process ends with one error line.
CHOWN_FAILS = """
import errno, os, sys
import engramd.guards.safe_paths
engramd.guards.safe_paths.check_group_usable = lambda group, gid: None
def chown(path, uid, gid, **kw):
    raise PermissionError(errno.EPERM, "Operation not permitted", path)
os.chown = chown
from engramd.cli.main import main
main(sys.argv[1:], prog_name="engramd")
"""


def test_a_failure_after_the_bind_closes_the_socket_and_exits(socket_dir, shm_dir):
    group = grp.getgrgid(os.getgid()).gr_name
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    result = subprocess.run([sys.executable, "-c", CHOWN_FAILS, "serve", "--socket", endpoint, "--shm-dir", shm_dir,
                             "--no-progress", "--group", group], capture_output=True, text=True,
                            timeout=PROCESS_TIMEOUT_S)
    assert result.returncode == 1, result.stderr
    (line,) = error_lines(result.stderr)
    assert socket_dir in line and "Operation not permitted" in line, line
    assert not [name for name in os.listdir(socket_dir) if name.startswith("engramd.sock")]
    with pytest.raises(OSError):
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(endpoint[len("ipc://"):])
        finally:
            probe.close()
