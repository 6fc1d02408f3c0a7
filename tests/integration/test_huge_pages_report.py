"""The served table's huge-page coverage, as a real daemon measures and reports it: 100% on a real
huge=always tmpfs (mounted for the test; skipped without root), none on plain /dev/shm, in status,
in `engramd status` and in the log."""
from __future__ import annotations

import subprocess
import sys

from tmpfs_mount import mounted_tmpfs


def status_text(endpoint: str) -> str:
    return subprocess.run([sys.executable, "-m", "engramd", "status", "--socket", endpoint], capture_output=True,
                          text=True, timeout=30).stdout


def test_a_table_on_a_huge_always_tmpfs_is_reported_covered(daemon_factory, tmp_path):
    with mounted_tmpfs(tmp_path / "huge", "huge=always,size=128m") as mount:
        daemon = daemon_factory(shm=mount)
        pages = daemon.wait_state("ready")["huge_pages"]
        assert pages["coverage"] == 1.0 and pages["huge_bytes"] == pages["bytes"] > 0, pages
        assert "100% of the table" in status_text(daemon.endpoint)
        assert "100% of its" in daemon.log()
        daemon.stop()


def test_a_table_on_plain_dev_shm_is_reported_without_huge_pages(daemon_factory):
    if "[never]" not in open("/sys/kernel/mm/transparent_hugepage/shmem_enabled").read():
        import pytest
        pytest.skip("this machine gives tmpfs huge pages without huge=always")
    daemon = daemon_factory()
    pages = daemon.wait_state("ready")["huge_pages"]
    assert pages["coverage"] == 0.0 and pages["page_bytes"] == 4096, pages
    assert "0% of the table" in status_text(daemon.endpoint) and "0% of its" in daemon.log()
    assert "has 0% of it on huge pages" not in daemon.log(), "a 32 MiB demo table is below the warning's size"
