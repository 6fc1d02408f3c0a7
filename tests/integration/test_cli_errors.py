"""Every command ends a failure with one ``error:`` line, never a traceback.

Real causes only: a read-only tmpfs mount, a file where a directory belongs, and a
second user (nobody) meeting root's sockets and directories.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from engramd.synth.writer import write_checkpoint
from tmpfs_mount import mounted_tmpfs

PROCESS_TIMEOUT_S = 60
AS_NOBODY = textwrap.dedent("""
    import os, sys
    # Not engramd.synth.writer: no command here is synth, the one that needs torch (seconds of import).
    import engramd.cli.main, engramd.daemon.remote_status, engramd.loading.checkpoint  # noqa: F401
    import engramd.daemon.server, engramd.shm.fs_check  # noqa: F401
    os.setgid(65534); os.setuid(65534)  # after the imports: the interpreter's files may be root's
    engramd.cli.main.main(sys.argv[1:], prog_name="engramd")
""")


def engramd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engramd", *args], capture_output=True, text=True,
                          timeout=PROCESS_TIMEOUT_S)


def engramd_as_nobody(*args: str) -> subprocess.CompletedProcess:
    if os.getuid() != 0:
        pytest.skip("needs root to run a command as another user")
    return subprocess.run([sys.executable, "-c", AS_NOBODY, *args], capture_output=True, text=True,
                          timeout=PROCESS_TIMEOUT_S, cwd="/")


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The single ``error:`` line of a failed command; fails on a traceback or on several lines."""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0]


@pytest.fixture
def read_only_tmpfs(tmp_path):
    with mounted_tmpfs(tmp_path / "ro", "ro,size=1m") as mount:
        yield mount


def test_serve_on_a_read_only_shm_dir(read_only_tmpfs, socket_dir):
    line = one_error_line(engramd("serve", "--socket", f"ipc://{socket_dir}/s.sock", "--shm-dir", read_only_tmpfs,
                                  "--no-progress"))
    assert read_only_tmpfs in line and "read-only" in line


def test_serve_on_an_shm_dir_this_user_may_not_write(shm_dir, tmp_path):
    socket_dir = tmp_path / "sock"
    socket_dir.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(socket_dir, 0o777)  # nobody may bind there; only the shm dir is in the way
    os.chmod(shm_dir, 0o755)  # readable and searchable, not writable
    line = one_error_line(engramd_as_nobody("serve", "--socket", f"ipc://{socket_dir}/s.sock", "--shm-dir", shm_dir,
                                            "--no-progress"))
    assert shm_dir in line and "may not create files there" in line


@pytest.mark.parametrize("command", [["stop"], ["reload"], ["status"]])
def test_daemon_commands_a_user_may_not_reach(demo_daemon, command):
    result = engramd_as_nobody(*command, "--socket", demo_daemon.endpoint)
    assert result.returncode == 4  # refused, which is not "no daemon" (3)
    assert "permission denied" in one_error_line(result)
    assert demo_daemon.status()["state"] == "ready"


def test_keys_on_a_read_only_directory(read_only_tmpfs):
    line = one_error_line(engramd("keys", os.path.join(read_only_tmpfs, "curve")))
    assert "cannot create CURVE keys" in line and "Read-only file system" in line


def test_keys_where_a_file_stands(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    line = one_error_line(engramd("keys", str(blocker / "curve")))
    assert "cannot create CURVE keys" in line and str(blocker) in line


def test_keys_as_a_user_who_may_not_write_there(tmp_path):
    os.chmod(tmp_path, 0o755)
    line = one_error_line(engramd_as_nobody("keys", str(tmp_path / "curve")))
    assert "Permission denied" in line and str(tmp_path / "curve") in line


def test_synth_into_a_read_only_directory(read_only_tmpfs):
    line = one_error_line(engramd("synth", os.path.join(read_only_tmpfs, "ckpt")))
    assert "cannot write the checkpoint" in line and "Read-only file system" in line


def test_inspect_a_checkpoint_this_user_may_not_read(tmp_path):
    checkpoint = tmp_path / "ckpt"
    write_checkpoint(str(checkpoint), vocab_size=300)
    os.chmod(tmp_path, 0o755)
    os.chmod(checkpoint, 0o700)
    line = one_error_line(engramd_as_nobody("inspect", str(checkpoint)))
    assert str(checkpoint) in line


def test_a_reader_that_goes_away_ends_the_command_quietly(demo_daemon):
    proc = subprocess.Popen([sys.executable, "-m", "engramd", "status", "--socket", demo_daemon.endpoint],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # as `engramd status | head -0` would
    stderr = proc.stderr.read()
    assert proc.wait(timeout=PROCESS_TIMEOUT_S) == 141  # the shell's code for a process ended by SIGPIPE
    assert stderr == "", stderr


def test_keys_never_replace_keys_in_use_without_force(tmp_path):
    keys = tmp_path / "curve"
    assert engramd("keys", str(keys)).returncode == 0
    before = (keys / "server.key_secret").read_bytes()
    line = one_error_line(engramd("keys", str(keys)))
    assert "already holds CURVE keys" in line and "--force" in line
    assert (keys / "server.key_secret").read_bytes() == before
    assert engramd("keys", str(keys), "--force").returncode == 0
    assert (keys / "server.key_secret").read_bytes() != before
