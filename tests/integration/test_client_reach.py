"""What a rank's client says when no daemon can answer it, or when it was closed: at once, in the
words the command line uses.

Real files at a real socket path, a real daemon; each client runs in a process of its own,
bounded well below the 60 s it was given, so a client that waits instead of saying fails.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ATTACH = textwrap.dedent("""
    import sys
    from engram_client import DaemonUnavailableError, EngramClient, SocketRefusedError
    try:
        EngramClient(endpoint=sys.argv[1], device="cpu", timeout=60)
        print("ATTACHED")
    except SocketRefusedError as exc:
        print("REFUSED", exc)
    except DaemonUnavailableError as exc:
        print("UNAVAILABLE", exc)
""")


def attach(endpoint: str) -> str:
    # 30 s: the client was given 60, and before it waited them all on a missing socket file.
    result = subprocess.run([sys.executable, "-c", ATTACH, endpoint], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_a_missing_socket_file_is_said_at_once(socket_dir):
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    assert attach(endpoint) == (f"UNAVAILABLE no engramd at {endpoint}: socket file missing (start engramd first, "
                                "or point ENGRAMD_SOCKET or endpoint= at its socket)")


def test_a_regular_file_at_the_socket_path_is_called_not_a_socket(socket_dir):
    # Before: a trust refusal ("a non-socket file of uid 0 ... neither root, this user, ..."), of root's own file.
    path = os.path.join(socket_dir, "engramd.sock")
    open(path, "w").close()
    said = attach(f"ipc://{path}")
    assert said.startswith(f"UNAVAILABLE no engramd at ipc://{path}: {path} is a regular file, not a socket"), said
    assert "neither root" not in said


def test_a_symbolic_link_at_the_socket_path_is_refused_as_a_link(socket_dir):
    path = os.path.join(socket_dir, "engramd.sock")
    os.symlink(os.path.join(socket_dir, "elsewhere.sock"), path)
    said = attach(f"ipc://{path}")
    assert said.startswith(f"REFUSED refusing to talk to engramd through {path}: it is a symbolic link"), said


STATUS_AFTER_CLOSE = textwrap.dedent("""
    import sys
    from engram_client import EngramClient, NotAttachedError
    client = EngramClient(endpoint=sys.argv[1], device="cpu", timeout=30)
    print("open", client.status()["state"])
    client.close()
    try:
        client.status()
        print("ANSWERED")
    except NotAttachedError as exc:
        print("closed", exc)
""")


def test_status_after_close_raises_not_attached(demo_daemon):
    result = subprocess.run([sys.executable, "-c", STATUS_AFTER_CLOSE, demo_daemon.endpoint], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["open ready", "closed client is closed"]
