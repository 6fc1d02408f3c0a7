"""Who may talk to the daemon and read its table; TCP only with CURVE, and status only."""
from __future__ import annotations

import grp
import os
import stat
import subprocess
import sys
import textwrap

import pytest
from waiting import free_port

from engram_client.attach.connection import DaemonConnection
from engram_client.core.errors import ProtocolError, RequestError
from engramd.guards.curve_keys import create_keys


def test_files_are_owner_only_by_default(demo_daemon):
    status = demo_daemon.status()
    sock = demo_daemon.endpoint[len("ipc://"):]
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(status["table_path"]).st_mode) == 0o600


def test_group_may_use_the_socket_and_read_the_table(daemon_factory):
    group = grp.getgrnam("daemon") if "daemon" in [g.gr_name for g in grp.getgrall()] else None
    if group is None:
        pytest.skip("no 'daemon' group on this machine")
    daemon = daemon_factory("--group", group.gr_name)
    status = daemon.wait_state("ready")
    sock = daemon.endpoint[len("ipc://"):]
    # The socket's directory: tests/integration/test_socket_dir_modes.py (only the daemon's own is re-moded).
    for path, mode in ((sock, 0o660), (status["table_path"], 0o640)):
        info = os.stat(path)
        assert stat.S_IMODE(info.st_mode) == mode, path
        assert info.st_gid == group.gr_gid, path


def test_unknown_group_is_refused(daemon_factory):
    daemon = daemon_factory("--group", "no-such-group-xyz")
    assert daemon.proc.wait(timeout=30) == 1
    assert "no such group" in daemon.log()


OTHER_USER = textwrap.dedent("""
    import os, sys, time
    from engram_client.attach.connection import DaemonConnection
    from engram_client.core.errors import DaemonUnavailableError
    os.setgid(65534); os.setuid(65534)  # nobody (after the imports: the interpreter's files may be root's)
    started = time.monotonic()
    try:
        DaemonConnection(sys.argv[1]).request("status", timeout=5)
        print("ANSWERED")
    except DaemonUnavailableError as exc:
        print("REFUSED", round(time.monotonic() - started, 2), exc)
""")


def test_a_user_without_access_gets_a_clear_error_not_a_hang(demo_daemon):
    if os.getuid() != 0:
        pytest.skip("needs root to run a process as another user")
    result = subprocess.run([sys.executable, "-c", OTHER_USER, demo_daemon.endpoint], capture_output=True,
                            text=True, timeout=60)
    assert result.stdout.startswith("REFUSED"), result.stdout + result.stderr
    assert "permission denied" in result.stdout


def test_tcp_needs_curve(daemon_factory, socket_dir):
    with pytest.raises(ProtocolError, match="CURVE"):
        DaemonConnection(f"tcp://127.0.0.1:{free_port()}")
    daemon = daemon_factory("--remote-status", f"tcp://127.0.0.1:{free_port()}")
    assert daemon.proc.wait(timeout=30) == 1
    assert "CURVE" in daemon.log()


def test_remote_status_over_curve_answers_status_only_and_only_to_authorized_keys(daemon_factory, tmp_path):
    keys = str(tmp_path / "keys")
    create_keys(keys)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    daemon = daemon_factory("--remote-status", endpoint, "--curve-keys-dir", keys)
    local = daemon.wait_state("ready")
    remote = DaemonConnection(endpoint, curve_keys_dir=keys)
    try:
        status = remote.request("status", timeout=10)
        assert status["boot_id"] == local["boot_id"] and status["state"] == "ready"
        with pytest.raises(RequestError, match="not served on this endpoint"):
            remote.request("stop", timeout=10)
        with pytest.raises(RequestError, match="not served on this endpoint"):
            remote.request("attach", {"pid": 1}, timeout=10)
    finally:
        remote.close()
    assert daemon.status()["state"] == "ready"  # the remote stop was refused
    # A keypair the daemon never authorized gets no answer at all.
    stranger = str(tmp_path / "stranger")
    create_keys(stranger)
    os.replace(os.path.join(keys, "server.key"), os.path.join(stranger, "server.key"))
    intruder = DaemonConnection(endpoint, curve_keys_dir=stranger)
    try:
        with pytest.raises(Exception, match="did not answer"):
            intruder.request("status", timeout=2)
    finally:
        intruder.close()
    cli = subprocess.run([sys.executable, "-m", "engramd", "status", "--socket", endpoint, "--curve-keys-dir",
                          stranger, "--json", "--timeout", "2"], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 3 and "error:" in cli.stderr


def test_no_request_can_make_the_daemon_unlink_a_foreign_file(demo_daemon, tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    for args in ({"checkpoint": str(tmp_path)}, {"checkpoint": "/"}, {"checkpoint": str(victim)}):
        with pytest.raises(Exception):
            demo_daemon.connection.request("reload", args)
    demo_daemon.connection.request("stop")
    assert demo_daemon.proc.wait(timeout=30) == 0
    assert victim.read_text() == "keep me"
