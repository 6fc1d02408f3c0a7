"""``engramd keys DIR`` and ``serve --curve-keys-dir DIR`` against a second real user.

Whoever may add a key to DIR/authorized/ may read the node's status over TCP, and whoever
reads a ``.key_secret`` may pose as its owner.  Another user watches the secrets being
written (the old code wrote each 0644 and chmodded it after), and plants a key in a keys
directory of its own; the command line and the daemon run as real processes.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest
import zmq

from engramd.guards.curve_keys import create_keys
from other_user import other_user  # noqa: F401  (a fixture)
from waiting import free_port

PROCESS_TIMEOUT_S = 60
WRITES = 300  # keypairs written while the other user polls (the old code leaked a secret within 2 of 3 runs' few)

# The other user opens every file in the directory whose name holds "secret", as fast as it can,
# until told to stop; it prints what it could read.
POLLER = """
import os, sys
directory, stop = sys.argv[1], sys.argv[2]
print("polling", flush=True)
read = set()
while not os.path.exists(stop):
    for name in os.listdir(directory):
        if "secret" in name:
            try:
                with open(os.path.join(directory, name)) as f:
                    if "secret-key" in f.read():
                        read.add(name)
            except OSError:
                pass
print("READ", sorted(read), flush=True)
"""


def engramd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engramd", *args], capture_output=True, text=True,
                          timeout=PROCESS_TIMEOUT_S)


@pytest.fixture
def shared_base():
    """A directory every user can reach (tmp_path is root's own)."""
    base = tempfile.mkdtemp(prefix="engt-keys-")
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_no_secret_is_readable_by_another_user_while_it_is_written(shared_base, other_user):
    keys = os.path.join(shared_base, "keys")
    os.mkdir(keys, 0o755)  # an existing directory others may list, as in the report
    stop = os.path.join(shared_base, "stop")
    poller = other_user.spawn_python(POLLER, keys, stop)
    try:
        assert poller.stdout.readline().strip() == "polling"
        for _ in range(WRITES):
            create_keys(keys)
    finally:
        open(stop, "w").close()
        out, err = poller.communicate(timeout=PROCESS_TIMEOUT_S)
    assert "READ []" in out, f"the other user read a secret key: {out}{err}"
    result = engramd("keys", keys, "--force")  # and the command line, as an operator runs it
    assert result.returncode == 0, result.stderr
    for name in ("server.key_secret", "client.key_secret"):
        assert stat.S_IMODE(os.stat(os.path.join(keys, name)).st_mode) == 0o600
    assert not [name for name in os.listdir(keys) if ".tmp-" in name], "a temporary key file was left"


def plant(directory: str, user) -> str:
    """A keys directory of ``user`` holding an authorized key of theirs (made here, then given to them)."""
    create_keys(directory)
    evil = os.path.join(directory, "authorized", "evil.key")
    shutil.copy(os.path.join(directory, "client.key"), evil)
    for root, dirs, files in os.walk(directory):
        for name in [root, *(os.path.join(root, entry) for entry in dirs + files)]:
            os.chown(name, user.uid, user.gid)
    return evil


def test_keys_refuses_a_directory_another_user_owns(shared_base, other_user):
    keys = os.path.join(shared_base, "keys")
    plant(keys, other_user)
    before = sorted(os.listdir(keys))
    result = engramd("keys", keys, "--force")
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert keys in line and f"uid {other_user.uid}" in line, line
    assert sorted(os.listdir(keys)) == before


@pytest.mark.parametrize("whose", ["keys-dir-of-another-user", "authorized-writable-by-others"])
def test_serve_refuses_keys_another_user_could_have_planted(daemon_factory, shared_base, other_user, whose):
    keys = os.path.join(shared_base, "keys")
    if whose == "keys-dir-of-another-user":
        plant(keys, other_user)
        refused = keys
    else:
        create_keys(keys)
        refused = os.path.join(keys, "authorized")
        os.chmod(refused, 0o1777)  # sticky does not help: another user may still add evil.key
    daemon = daemon_factory("--remote-status", f"tcp://127.0.0.1:{free_port()}", "--curve-keys-dir", keys)
    assert daemon.proc.wait(timeout=PROCESS_TIMEOUT_S) == 1, daemon.log()
    log = daemon.log()
    assert refused in log and ("uid" in log or "writable by group or others" in log), log
    assert "remote status on" not in log


def test_key_files_load_as_zeromq_certificates(tmp_path):
    paths = create_keys(str(tmp_path / "keys"))
    public, secret = zmq.auth.load_certificate(paths["server_secret"])
    assert secret is not None and zmq.auth.load_certificate(paths["server_public"]) == (public, None)
    assert os.listdir(paths["authorized"]) == ["client.key"]
    assert zmq.auth.load_certificate(os.path.join(paths["authorized"], "client.key"))[0] == \
        zmq.auth.load_certificate(paths["client_public"])[0]
