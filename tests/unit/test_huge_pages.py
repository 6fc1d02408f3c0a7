"""Huge-page coverage of a table file, measured from a real mapping's smaps: a plain /dev/shm file
(4 KiB pages), a real huge=always tmpfs (mounted for the test, or skipped without root), and the
warning a large table without huge pages gets."""
from __future__ import annotations

import logging
import os

import pytest

from engramd.shm import huge_pages
from tmpfs_mount import mounted_tmpfs

SIZE = 8 << 20


def write(path: str) -> str:
    with open(path, "wb") as f:
        f.write(os.urandom(SIZE))
    return path


def test_a_file_on_dev_shm_has_no_huge_pages(shm_dir):
    found = huge_pages.measure(write(os.path.join(shm_dir, "t")), SIZE)
    if open("/sys/kernel/mm/transparent_hugepage/shmem_enabled").read().find("[never]") < 0:
        pytest.skip("this machine's shmem_enabled gives tmpfs huge pages anyway")
    assert found == {"bytes": SIZE, "huge_bytes": 0, "coverage": 0.0, "page_bytes": 4096}


def test_a_file_on_a_huge_always_tmpfs_is_covered_whole(tmp_path):
    with mounted_tmpfs(tmp_path / "huge", "huge=always,size=32m") as mount:
        found = huge_pages.measure(write(os.path.join(mount, "t")), SIZE)
        os.unlink(os.path.join(mount, "t"))
    assert found["coverage"] == 1.0 and found["page_bytes"] == 2 << 20 and found["huge_bytes"] == SIZE


def test_a_large_table_without_huge_pages_is_warned_about_with_the_figures(shm_dir, monkeypatch, caplog):
    monkeypatch.setattr(huge_pages, "WARN_BYTES", SIZE)
    with caplog.at_level(logging.INFO, logger="engramd"):
        found = huge_pages.report(write(os.path.join(shm_dir, "t")), SIZE)
    if found["coverage"]:
        pytest.skip("this machine gives tmpfs huge pages anyway")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "0% of it on huge pages" in warnings[0] and "6.4 ms" in warnings[0], warnings
    assert huge_pages.report(os.path.join(shm_dir, "missing"), SIZE) is None  # a failure is logged, not raised
