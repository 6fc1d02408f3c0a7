"""`engramd synth` never mixes a new checkpoint with an old one's files."""
from __future__ import annotations

import os
import stat

from click.testing import CliRunner

from engramd.loading.checkpoint import read_checkpoint
from engramd.cli.main import main


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


def test_a_non_empty_directory_is_refused_and_left_as_it_was(tmp_path):
    outdir = tmp_path / "ckpt"
    assert cli("synth", str(outdir), "--vocab-size", "300").exit_code == 0
    before = {p.name: p.read_bytes() for p in outdir.iterdir()}
    result = cli("synth", str(outdir), "--vocab-size", "400", "--shards", "2")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {outdir} is not empty (config.json, model.safetensors)")
    assert "--force" in result.stderr
    assert {p.name: p.read_bytes() for p in outdir.iterdir()} == before


def test_force_replaces_only_checkpoint_files(tmp_path):
    outdir = tmp_path / "ckpt"
    assert cli("synth", str(outdir), "--vocab-size", "300").exit_code == 0  # one model.safetensors
    (outdir / "NOTES.md").write_text("kept")
    result = cli("synth", str(outdir), "--vocab-size", "400", "--shards", "2", "--force")
    assert result.exit_code == 0, result.output
    assert "removed the old checkpoint files config.json, model.safetensors; kept NOTES.md" in result.stdout
    assert sorted(p.name for p in outdir.iterdir()) == [
        "NOTES.md", "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json"]  # no stale model.safetensors beside the new shards
    plan = read_checkpoint(str(outdir))
    assert len(plan.files) == 2


def test_every_file_gets_the_same_mode(tmp_path):
    outdir = tmp_path / "ckpt"
    assert cli("synth", str(outdir), "--vocab-size", "300", "--shards", "3").exit_code == 0
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in outdir.iterdir()}
    umask = os.umask(0)
    os.umask(umask)
    assert set(modes.values()) == {0o666 & ~umask}, modes
