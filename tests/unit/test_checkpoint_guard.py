"""Checks that a checkpoint did not change while it was loaded, on real files."""
from __future__ import annotations

import os

import numpy as np
import pytest

from engram_client.core.errors import CheckpointError
from engramd.loading.checkpoint import read_checkpoint
from engramd.guards.checkpoint_guard import CheckpointGuard, sample_rows
from engramd.loading.loader import CheckpointSource, Progress, fill_table
from engramd.synth.writer import write_checkpoint
from engramd.shm.table_files import ShmDir
from engram_client.core.table_file import TableHeader


def test_sampled_rows_include_both_ends():
    assert sample_rows(5) == [0, 1, 2, 3, 4]
    rows = sample_rows(1_000_000)
    assert rows[0] == 0 and rows[-1] == 999_999 and len(rows) == len(set(rows)) <= 16


def test_a_rewritten_shard_is_noticed(tmp_path):
    write_checkpoint(str(tmp_path / "c"), vocab_size=300, head_dim=128)
    shard = str(tmp_path / "c" / "model.safetensors")
    guard = CheckpointGuard([shard])
    guard.check_unchanged()
    with open(shard, "r+b") as f:  # same size, same inode: only the times tell
        f.seek(os.path.getsize(shard) - 1)
        f.write(b"\x01")
    with pytest.raises(CheckpointError, match=f"{shard}: changed during the load"):
        guard.check_unchanged()


def test_rows_that_differ_from_the_checkpoint_are_noticed(tmp_path):
    write_checkpoint(str(tmp_path / "c"), vocab_size=300, head_dim=128)
    plan = read_checkpoint(str(tmp_path / "c"))
    header = TableHeader.plan(plan.layouts, plan.fingerprint, plan.directory, 1)
    shm = ShmDir(str(tmp_path), "0123456789ab")
    source = CheckpointSource(plan)
    writer = shm.create(header)
    try:
        fill_table(writer, source, Progress(), threads=2)
        guard = CheckpointGuard(list(plan.files))
        guard.verify(source, header, writer.read)  # a faithful copy passes
        entry = header.layers[-1]
        last_row = entry.offset + (entry.layout.rows - 1) * entry.layout.row_bytes
        writer.write(last_row, np.frombuffer(bytes(~np.frombuffer(writer.read(last_row, 8), np.uint8)), np.uint8))
        with pytest.raises(CheckpointError, match=f"layer {entry.layout.layer}, row {entry.layout.rows - 1}"):
            guard.check_rows(source, header, writer.read)
    finally:
        writer.abandon()
        source.close()
        shm.close()
