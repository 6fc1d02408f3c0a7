"""A lock is good only on the file still at its path (safe_paths.take_lock, release_lock), on real files.

The stopping holder's unlink is made to land between the open and the flock, where a
real race puts it.
"""
from __future__ import annotations

import fcntl
import os

import pytest

from engramd.guards import safe_paths
from engramd.guards.safe_paths import release_lock, take_lock


def _same(fd: int, path: str) -> bool:
    a, b = os.fstat(fd), os.lstat(path)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def test_a_lock_won_on_a_file_unlinked_meanwhile_is_taken_again(tmp_path, monkeypatch):
    path = str(tmp_path / "engramd.sock.lock")
    real_flock = fcntl.flock
    unlinked = []

    def flock_after_the_holder_left(fd, operation):
        if not unlinked:
            os.unlink(path)  # the holder's release: unlink while locked, then let go
            unlinked.append(path)
        return real_flock(fd, operation)

    monkeypatch.setattr(safe_paths.fcntl, "flock", flock_after_the_holder_left)
    open(path, "w").close()
    fd = take_lock(path, "socket lock", lambda: "busy")
    try:
        assert unlinked and _same(fd, path), "the lock is held on a file no longer at its path"
    finally:
        os.close(fd)


def test_release_unlinks_only_its_own_file(tmp_path):
    path = str(tmp_path / "engramd.lock")
    fd = take_lock(path, "lock file", lambda: "busy")
    os.unlink(path)
    with open(path, "w") as f:  # someone else's file now stands at the path
        f.write("theirs\n")
    release_lock(path, fd)
    assert open(path).read() == "theirs\n"
    with pytest.raises(OSError):
        os.fstat(fd)  # and the descriptor is closed


def test_release_unlinks_its_file_while_still_locked(tmp_path):
    path = str(tmp_path / "engramd.lock")
    fd = take_lock(path, "lock file", lambda: "busy")
    release_lock(path, fd)
    assert not os.path.exists(path)
