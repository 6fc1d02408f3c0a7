"""A real second local user for attacks that only another user can make.

Where the tests run as root, ``other_user`` creates a throwaway account (useradd), runs
the attacker's steps as that user in subprocesses (setgid/setuid before exec), and
deletes the account afterwards; ``daemon_user`` is a second such account, for a daemon
that runs unprivileged.  Elsewhere the tests that need them skip, saying why.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest

SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


@dataclass
class OtherUser:
    name: str
    uid: int
    gid: int

    def _demote(self):
        os.setgroups([])
        os.setgid(self.gid)
        os.setuid(self.uid)

    def run(self, *argv: str, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess:
        """Run a command as this user; returns the finished process (output captured)."""
        result = subprocess.run(list(argv), preexec_fn=self._demote, capture_output=True, text=True,
                                timeout=timeout, cwd="/")
        if check and result.returncode != 0:
            raise AssertionError(f"{argv} as {self.name} exited {result.returncode}: {result.stderr}")
        return result

    def command(self, *argv: str) -> list[str]:
        """``argv`` as this user, through setpriv: the exec still searches paths as root, so an
        interpreter under a root-only home (the test venv's base Python) can start; the process
        then has this user's uid and gid, no other groups and no capabilities."""
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv (util-linux) is not installed")
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", *argv]

    def spawn(self, *argv: str, **popen) -> subprocess.Popen:
        """A long-running process of this user (the caller ends it), started as ``command`` says."""
        return subprocess.Popen(self.command(*argv), **popen)

    def spawn_python(self, code: str, *args: str) -> subprocess.Popen:
        """A long-running attacker process (the caller ends it), on the system's Python with the
        standard library only: the test interpreter may live where the other user cannot read."""
        return subprocess.Popen([SYSTEM_PYTHON, "-c", code, *args], preexec_fn=self._demote, cwd="/",
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextlib.contextmanager
def created_user():
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second local user (run the tests as root)")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("useradd/userdel are not installed")
    name = f"engt{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name],
                   check=True, capture_output=True, timeout=60)
    try:
        import pwd
        entry = pwd.getpwnam(name)
        yield OtherUser(name, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=60)


@pytest.fixture
def other_user():
    with created_user() as user:
        yield user


@pytest.fixture
def daemon_user():
    """Another throwaway account, for a daemon run unprivileged beside other_user."""
    with created_user() as user:
        yield user
