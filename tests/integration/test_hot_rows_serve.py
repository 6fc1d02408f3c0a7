"""`engramd serve --hot-rows`: a list that fits is published beside the table and reaches every rank
(MappedGeneration.hot_list); a foreign one fails the first load, naming the file; a reload onto
another checkpoint is served without it; the list's copy goes with its generation."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from engram_client import EngramClient
from engram_client.core.hot_list import read_hot_list
from engramd.cli.main import main
from engramd.loading.hot_rows_build import build_hot_rows
from waiting import wait_for


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two synthetic checkpoints with tokenizers under one reload root, and a list built for the first."""
    root = tmp_path_factory.mktemp("models")
    for name, seed in (("a", 0), ("b", 1)):
        result = CliRunner().invoke(main, ["synth", str(root / name), "--vocab-size", "300", "--tokenizer-vocab",
                                           "400", "--seed", str(seed)])
        assert result.exit_code == 0, result.output
    text = root / "traffic.txt"
    words = [w for w in (root / "a" / "tokenizer.json").read_text().split('"') if w.isalpha()][:200]
    rng = np.random.default_rng(5)
    text.write_text("\n".join(" ".join(rng.choice(words, 12)) for _ in range(300)) + "\n")
    hot = root / "a.hot"
    build_hot_rows(str(root / "a"), [str(text)], str(hot), rows_per_layer=64)
    return root, hot


def hot_files(daemon) -> list[str]:
    found = []
    for directory, _, names in os.walk(daemon.shm_dir):
        found += [os.path.join(directory, name) for name in names if ".hot" in name]
    return sorted(found)


def test_a_fitting_list_reaches_every_rank_and_goes_with_its_generation(daemon_factory, models):
    root, hot_path = models
    daemon = daemon_factory("--checkpoint", str(root / "a"), "--hot-rows", str(hot_path))
    status = daemon.wait_state("ready")
    served = status["hot_rows"]
    assert status["hot_rows_error"] is None and served["source"] == str(hot_path)
    assert os.path.dirname(served["path"]) == os.path.dirname(status["table_path"]) and hot_files(daemon) == [served["path"]]
    assert stat.S_IMODE(os.stat(served["path"]).st_mode) == 0o400
    original = read_hot_list(str(hot_path))
    assert served["layers"] == {str(layer): 64 for layer in original.layers}
    with EngramClient(endpoint=daemon.endpoint, device="cpu") as client:
        mapped = client._state.mapped
        assert mapped.hot_list is not None and mapped.hot_list.layers == original.layers
        for layer in original.layers:
            assert np.array_equal(mapped.hot_list.ranked(layer), original.ranked(layer))
        assert mapped.hot_list.sha256 == served["sha256"] and mapped.hot_list_seconds > 0
    text = CliRunner().invoke(main, ["status", "--socket", daemon.endpoint]).output
    assert f"hot rows    {served['path']} (from {hot_path}" in text and "layer 1: 64 rows" in text
    daemon.connection.request("stop")
    daemon.proc.wait(timeout=30)
    assert hot_files(daemon) == [] and daemon.table_files() == []


def test_a_foreign_list_fails_the_first_load_naming_the_file(daemon_factory, models):
    root, hot_path = models
    daemon = daemon_factory("--checkpoint", str(root / "b"), "--hot-rows", str(hot_path))
    status = daemon.wait_state("failed")
    assert f"{hot_path}: the hot-row list was built for the checkpoint with fingerprint" in status["error"]
    assert f"({root / 'a'})" in status["error"] and "build one for this checkpoint" in status["error"]
    assert daemon.table_files() == [] and hot_files(daemon) == []  # refused before a row was copied
    assert status["hot_rows"] is None
    # Status names the list as what failed, not "no list served (no --hot-rows)" with a null error.
    failed_on = f"the hot-row list failed the load: {hot_path}: the hot-row list was built for"
    assert status["hot_rows_error"].startswith(failed_on)
    assert status["generations"][0]["hot_rows_error"].startswith(failed_on)
    result = subprocess.run([sys.executable, "-m", "engramd", "status", "--socket", daemon.endpoint],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert "no --hot-rows" not in result.stdout and "loaded by this daemon" not in result.stdout
    assert "generation  1 (its load failed)" in lines
    assert any(line.startswith(f"hot rows    {failed_on}") for line in lines), result.stdout


def test_a_reload_onto_another_checkpoint_is_served_without_the_list(daemon_factory, models):
    root, hot_path = models
    daemon = daemon_factory("--checkpoint", str(root / "a"), "--hot-rows", str(hot_path))
    served = daemon.wait_state("ready")["hot_rows"]
    first = served["path"]
    daemon.connection.request("reload", {"checkpoint": str(root / "b")})
    wait_for(lambda: daemon.status()["generation"] == 2 and daemon.status()["state"] == "ready",
             "generation 2 to be served", 30)
    status = daemon.status()
    assert status["hot_rows"] is None and status["checkpoint"] == str(root / "b")
    assert status["hot_rows_error"].startswith(f"served without the hot-row list: {hot_path}: ")
    assert "generation 2 is served without the hot-row list" in daemon.log()
    wait_for(lambda: not os.path.exists(first), "generation 1's list to go with its table", 10)
    with EngramClient(endpoint=daemon.endpoint, device="cpu") as client:
        assert client._state.mapped.hot_list is None
    text = CliRunner().invoke(main, ["status", "--socket", daemon.endpoint]).output
    assert "hot rows    served without the hot-row list" in text
    daemon.connection.request("reload", {"checkpoint": str(root / "a")})  # back to the list's checkpoint
    wait_for(lambda: daemon.status()["generation"] == 3 and daemon.status()["state"] == "ready",
             "generation 3 to be served", 30)
    again = daemon.status()
    assert again["hot_rows"]["layers"] == served["layers"] and again["hot_rows_error"] is None
    assert again["hot_rows"]["path"].endswith("-g3.hot")


def test_a_damaged_list_stops_serve_at_once(tmp_path, socket_dir):
    bad = tmp_path / "bad.hot"
    bad.write_bytes(b"not a list at all, not even close")
    args = ["serve", "--socket", f"ipc://{socket_dir}/x.sock", "--shm-dir", str(tmp_path)]
    result = CliRunner().invoke(main, [*args, "--hot-rows", str(bad)])
    assert result.exit_code == 1
    assert f"error: --hot-rows: {bad}: not a hot-row list" in result.stderr
    config = tmp_path / "engramd.toml"
    config.write_text(f'hot_rows = "{tmp_path / "missing.hot"}"\n')
    result = CliRunner().invoke(main, [*args, "--config", str(config)])
    assert result.exit_code == 1
    assert f"{config}: hot_rows: {tmp_path / 'missing.hot'}: cannot open the hot-row list" in result.stderr


def test_a_restart_that_re_adopts_the_table_publishes_the_list_again(daemon_factory, models):
    root, hot_path = models
    args = ("--checkpoint", str(root / "a"), "--hot-rows", str(hot_path))
    daemon = daemon_factory(*args)
    before = daemon.wait_state("ready")["hot_rows"]
    daemon.kill()
    assert hot_files(daemon) == [before["path"]]  # a crash leaves it, as it leaves the table
    restarted = daemon_factory(*args)
    status = restarted.wait_state("ready")
    assert status["adopted"] and status["hot_rows"]["path"] == before["path"]
    assert status["hot_rows"]["sha256"] == before["sha256"] and hot_files(restarted) == [before["path"]]
    with EngramClient(endpoint=restarted.endpoint, device="cpu") as client:
        assert client._state.mapped.hot_list.sha256 == before["sha256"]


def test_reload_wait_says_the_list_was_dropped(daemon_factory, models):
    """`engramd reload --wait` as a process: served, and served without the list, both said."""
    root, hot_path = models
    daemon = daemon_factory("--checkpoint", str(root / "a"), "--hot-rows", str(hot_path))
    daemon.wait_state("ready")
    result = subprocess.run([sys.executable, "-m", "engramd", "reload", "--socket", daemon.endpoint,
                             "--checkpoint", str(root / "b"), "--wait", "60"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith("generation 2 is served (after "), lines
    assert lines[2].startswith(f"generation 2 is served without the hot-row list: {hot_path}: "), lines
    back = subprocess.run([sys.executable, "-m", "engramd", "reload", "--socket", daemon.endpoint,
                           "--checkpoint", str(root / "a"), "--wait", "60"], capture_output=True, text=True,
                          timeout=120)
    assert back.returncode == 0 and "without the hot-row list" not in back.stdout, back.stdout + back.stderr
