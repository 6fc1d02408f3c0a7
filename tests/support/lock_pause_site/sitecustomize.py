"""Loaded by Python at start when this directory is on PYTHONPATH: holds engramd between opening
its socket lock file and locking it, the window in which a start races a stop.

No real timing can hold a process in that window on purpose, so this does, and only that:
the first exclusive flock(2) on a file whose name ends in ``.sock.lock`` waits until the
file ``$ENGRAMD_TEST_LOCK_GATE.go`` exists, after creating ``$ENGRAMD_TEST_LOCK_GATE.held``
(bounded: 60 s).  tests/integration/test_lock_race.py uses it; nothing else changes.
"""
import fcntl
import os
import time

_GATE = os.environ.get("ENGRAMD_TEST_LOCK_GATE")
_flock = fcntl.flock
_held = []


def _gated_flock(fd, operation):
    if not _held and operation & fcntl.LOCK_EX:
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            name = ""
        if name.endswith(".sock.lock"):
            _held.append(name)
            open(_GATE + ".held", "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(_GATE + ".go") and time.monotonic() < deadline:
                time.sleep(0.01)
    return _flock(fd, operation)


if _GATE:
    fcntl.flock = _gated_flock
