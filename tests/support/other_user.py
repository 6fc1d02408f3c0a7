"""A real second local user for attacks that only another user can make.

Where the tests run as root, ``other_user`` creates a throwaway account (useradd), runs
the attacker's steps as that user in subprocesses (setgid/setuid before exec), and
deletes the account afterwards; ``daemon_user`` is a second such account, for a daemon
that runs unprivileged.  Elsewhere the tests that need them skip, saying why.
``OtherUser.serve`` runs a real ``engramd serve`` as that user (an impostor daemon).
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from typing import IO

# What `engramd serve` imports (pyproject's dependencies) and the packages themselves.
DAEMON_PACKAGES = ("engramd", "engram_client", "numpy", "zmq", "msgpack", "click", "prometheus_client", "tokenizers")

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

    def serve(self, site: str, endpoint: str, shm_dir: str, *extra: str, output: IO) -> subprocess.Popen:
        """``engramd serve`` as this user, on the system's Python with the packages in ``site``
        (daemon_site); its log goes to ``output``.  The caller ends it."""
        argv = [SYSTEM_PYTHON, "-s", "-m", "engramd", "serve", "--socket", endpoint, "--shm-dir", shm_dir,
                "--no-progress", "--log-level", "info", *extra]
        env = {"PYTHONPATH": site, "PATH": "/usr/bin:/bin", "HOME": "/", "PYTHONDONTWRITEBYTECODE": "1"}
        return subprocess.Popen(argv, preexec_fn=self._demote, cwd="/", env=env, stdout=output,
                                stderr=subprocess.STDOUT)


def daemon_site() -> str:
    """A directory every user can read holding engramd and what it imports, as the test
    interpreter has them (hard links where possible): that interpreter's own tree may be one
    only root can enter.  Skips where the system's Python could not load these extensions.
    The caller removes it."""
    if sysconfig.get_config_var("SOABI") != subprocess.run(
            [SYSTEM_PYTHON, "-c", "import sysconfig; print(sysconfig.get_config_var('SOABI'))"],
            capture_output=True, text=True, timeout=60).stdout.strip():
        pytest.skip(f"{SYSTEM_PYTHON} is not the test interpreter's Python version: it cannot run this engramd")
    site = tempfile.mkdtemp(prefix="engt-site-")
    os.chmod(site, 0o755)
    sources = set()
    for name in DAEMON_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            pytest.skip(f"package {name} is not installed")
        package = spec.submodule_search_locations[0]
        sources.add(package)
        parent = os.path.dirname(package)
        sources.update(os.path.join(parent, entry) for entry in os.listdir(parent) if entry.endswith(".libs"))
    for source in sources:
        shutil.copytree(source, os.path.join(site, os.path.basename(source)), copy_function=_link_or_copy,
                        ignore=shutil.ignore_patterns("__pycache__", "tests"))
    return site


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


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
