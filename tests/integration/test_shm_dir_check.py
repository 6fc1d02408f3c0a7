"""`serve --shm-dir`: memory file systems only, unless the operator accepts a disk; the page size is logged."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from engramd.shm.fs_check import inspect_shm_dir
from tmpfs_mount import mounted_tmpfs

PROCESS_TIMEOUT_S = 60


@pytest.fixture
def disk_dir(tmp_path):
    found = inspect_shm_dir(str(tmp_path))
    if found.in_memory:
        pytest.skip(f"{tmp_path} is on {found.kind} here, not on a disk")
    return str(tmp_path)


def serve(socket_dir: str, shm: str, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engramd", "serve", "--socket", f"ipc://{socket_dir}/s.sock",
                           "--shm-dir", shm, "--no-progress", *extra], capture_output=True, text=True,
                          timeout=PROCESS_TIMEOUT_S, env={**os.environ, **(env or {})})


def test_a_disk_directory_is_refused_naming_its_file_system(socket_dir, disk_dir):
    result = serve(socket_dir, disk_dir)
    assert result.returncode == 1
    kind = inspect_shm_dir(disk_dir).kind
    assert f"error: --shm-dir {disk_dir} is on {kind}, not tmpfs or hugetlbfs" in result.stderr
    assert "--allow-disk" in result.stderr
    assert os.listdir(disk_dir) == [], "nothing written to the refused directory"


@pytest.mark.parametrize("how", [("--allow-disk",), ()])
def test_allow_disk_serves_from_a_disk_directory_and_says_so(daemon_factory, disk_dir, how, monkeypatch):
    if not how:
        monkeypatch.setenv("ENGRAMD_ALLOW_DISK", "1")  # the same setting, from the environment
    daemon = daemon_factory(*how, shm=disk_dir)
    status = daemon.wait_state("ready")
    assert os.path.dirname(status["table_path"]) == disk_dir
    assert f"shm dir {disk_dir} is on {inspect_shm_dir(disk_dir).kind}, not in memory" in daemon.log()


def test_the_log_says_which_pages_the_table_gets(demo_daemon):
    demo_daemon.wait_state("ready")
    page_kib = os.sysconf("SC_PAGE_SIZE") // 1024
    assert f"shm dir {demo_daemon.shm_dir} is tmpfs: the table gets {page_kib} KiB pages" in demo_daemon.log()


def test_a_huge_always_tmpfs_gives_huge_pages(tmp_path):
    with mounted_tmpfs(tmp_path / "huge", "huge=always,size=64m") as mount:
        found = inspect_shm_dir(mount)
    assert found.kind == "tmpfs" and found.in_memory
    assert found.page_size >= 2 * 2**20
    assert "MiB pages" in found.describe()


def test_print_config_shows_allow_disk_and_resolved_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shm").mkdir()
    result = subprocess.run([sys.executable, "-m", "engramd", "serve", "--print-config", "--shm-dir", "shm",
                             "--socket", "ipc://rel.sock"], capture_output=True, text=True,
                            timeout=PROCESS_TIMEOUT_S, env={**os.environ, "ENGRAMD_ALLOW_DISK": "true"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "allow_disk = true  # environment (ENGRAMD_ALLOW_DISK)" in lines
    assert f'shm_dir = "{tmp_path}/shm"  # command line; resolved from "shm"' in lines
    assert any(line.startswith('events_socket = "ipc://rel.sock.events"  # default; resolved from unset')
               for line in lines), result.stdout
