"""Debian's prometheus package (prometheus and promtool, 2.42 on bookworm) for the tests that need it.

Found on PATH, or installed once where this can be done (root, with apt-get, a package
registry reachable): `apt-get install --no-install-recommends prometheus`, after `apt-get
update` if the package lists do not know it yet.  Otherwise the reason is returned, and the
tests skip with it.  One line on stderr says an install runs; its output goes to a log file,
kept (and named in the reason) only when the install fails.  ``prometheus_binaries`` is the
fixture the tests take them from (imported into each test module that needs it).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

PACKAGE = "prometheus"
INSTALL_TIMEOUT_S = 600  # a fresh machine: the package lists, then about 30 MB of packages


def _found() -> tuple[str, str] | None:
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    return (prometheus, promtool) if prometheus and promtool else None


def _apt(log, *args: str) -> bool:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        return subprocess.run(["apt-get", "-q", *args], stdin=subprocess.DEVNULL, stdout=log,
                              stderr=subprocess.STDOUT, env=env, timeout=INSTALL_TIMEOUT_S).returncode == 0
    except subprocess.TimeoutExpired:
        log.write(f"\napt-get {' '.join(args)} did not finish within {INSTALL_TIMEOUT_S} s\n".encode())
        return False


def prometheus_tools(announce) -> tuple[str, str] | str:
    """(path of prometheus, path of promtool), or why they cannot be had; ``announce(line)`` is
    told before an install starts."""
    found = _found()
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return ("needs Debian's prometheus package (prometheus, promtool): not on PATH, and this is not root "
                "with apt-get to install it (apt-get install prometheus)")
    fd, log_path = tempfile.mkstemp(prefix="engramd-apt-", suffix=".log")
    announce(f"tests: installing Debian's {PACKAGE} package (prometheus, promtool) for the Prometheus tests, "
             f"once; log in {log_path}")
    with os.fdopen(fd, "wb") as log:
        install = ("install", "-y", "--no-install-recommends", PACKAGE)
        done = _apt(log, *install) or (_apt(log, "update") and _apt(log, *install))
    found = _found()
    if done and found:
        os.unlink(log_path)
        return found
    with open(log_path, errors="replace") as f:
        tail = " | ".join(f.read().strip().splitlines()[-3:])
    return f"could not install Debian's {PACKAGE} package (apt-get install {PACKAGE}): {tail} (log {log_path})"


@pytest.fixture(scope="session")
def prometheus_binaries(pytestconfig) -> tuple[str, str]:
    """(prometheus, promtool), installed once if need be (the line saying so gets past pytest's
    capture, an install taking up to minutes); skips with the reason where they cannot be had."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")

    def announce(line: str) -> None:
        if capture is None:  # -p no:capture
            print(line, file=sys.stderr, flush=True)
            return
        with capture.global_and_fixture_disabled():
            print(line, file=sys.stderr, flush=True)

    found = prometheus_tools(announce)
    if isinstance(found, str):
        pytest.skip(found)
    return found
