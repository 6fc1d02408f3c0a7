"""The daemon's path checks on real files and directories: links, owners, modes, locks."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys

import pytest

from engramd.guards.safe_paths import UnsafePathError, check_directory, foreign_reason, open_owned, take_lock


def test_a_symbolic_link_is_never_followed(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        open_owned(str(link), os.O_RDWR | os.O_CREAT, "lock file")
    assert target.read_text() == "keep"


def test_a_file_others_may_write_is_refused(tmp_path):
    path = tmp_path / "table"
    path.write_bytes(b"x")
    os.chmod(path, 0o666)
    with pytest.raises(UnsafePathError, match="writable by group or others"):
        open_owned(str(path), os.O_RDONLY, "table file")
    assert "writable" in foreign_reason(str(path))
    os.chmod(path, 0o600)
    os.close(open_owned(str(path), os.O_RDONLY, "table file"))
    assert foreign_reason(str(path)) is None


def test_a_fifo_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "not a regular file" in foreign_reason(str(fifo))


def test_directories_writable_by_others_need_the_sticky_bit(tmp_path):
    directory = tmp_path / "d"
    directory.mkdir()
    os.chmod(directory, 0o777)
    with pytest.raises(UnsafePathError, match="no sticky bit"):
        check_directory(str(directory), "shm dir")
    os.chmod(directory, 0o1777)
    check_directory(str(directory), "shm dir")  # like /dev/shm
    with pytest.raises(UnsafePathError, match="writable by group or others"):
        check_directory(str(directory), "socket directory", must_be_ours=True)
    os.chmod(directory, 0o700)
    check_directory(str(directory), "socket directory", must_be_ours=True)


def test_a_linked_directory_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        check_directory(str(tmp_path / "alias"), "socket directory")


def test_a_held_lock_names_its_holder(tmp_path):
    path = str(tmp_path / "engramd.lock")
    holder = subprocess.Popen([sys.executable, "-c",
                               "import fcntl, os, sys, time\n"
                               "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)\n", path],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UnsafePathError, match=f"locked by pid {holder.pid}"):
            take_lock(path, "lock file", lambda: "another engramd owns it")
    finally:
        holder.kill()
        holder.wait(timeout=30)
    fd = take_lock(path, "lock file", lambda: "another engramd owns it")
    try:
        with pytest.raises(OSError):
            fcntl.flock(os.open(path, os.O_RDONLY), fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
