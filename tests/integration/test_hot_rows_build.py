"""`engramd hot-rows build` on a synthetic checkpoint with a tokenizer and real text files, checked
against an independent count: the client's hasher over each whole file's tokens."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from tokenizers import Tokenizer

from engram_client.core.hot_list import read_hot_list
from engram_client.core.layout import EngramConfig, build_layout
from engram_client.hashing.hasher import hasher_for_config
from engramd.cli.main import main
from engramd.loading.hot_rows_build import build_hot_rows
from engramd.loading.token_map import compressed_map


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "synth"
    result = CliRunner().invoke(main, ["synth", str(out), "--vocab-size", "300", "--tokenizer-vocab", "400"])
    assert result.exit_code == 0, result.output
    return out


def text_file(checkpoint, directory, name: str, seed: int, words: int = 6000) -> str:
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    vocab = sorted((i, w) for w, i in tokenizer.get_vocab().items() if i >= 4)
    rng = np.random.default_rng(seed)
    picks = np.minimum(rng.zipf(1.3, size=words) - 1, len(vocab) - 1)
    lines = [" ".join(vocab[p][1] for p in picks[i:i + 10]) for i in range(0, words, 10)]
    path = directory / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def independent_counts(checkpoint, files) -> list[Counter]:
    """Each layer's row counts from the client's hasher over each file's tokens at once."""
    config = EngramConfig.from_file(str(checkpoint / "config.json"))
    token_map, compressed = compressed_map(str(checkpoint / "tokenizer.json"))
    hasher = hasher_for_config(config, token_map, compressed, config.pad_token_id)
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    counts = [Counter() for _ in config.layer_ids]
    for path in files:
        with open(path) as f:
            ids = tokenizer.encode(f.read(), add_special_tokens=False).ids
        rows = hasher.row_ids(torch.tensor(ids, dtype=torch.int64)).numpy()
        for index, counter in enumerate(counts):
            counter.update(rows[:, index, :].reshape(-1).tolist())
    return counts


def check_against(hot, layouts, counts: list[Counter], keep) -> None:
    for layout, counter in zip(layouts, counts):
        keep_here = keep(layout.rows) if callable(keep) else keep
        ids, got = hot.ranked(layout.layer), hot.counts(layout.layer)
        assert ids.size == min(keep_here, len(counter))
        assert got.tolist() == [counter[int(i)] for i in ids]  # the counts are the rows' true counts
        top = sorted(counter.values(), reverse=True)[:keep_here]
        assert got.tolist() == top  # and they are the most frequent (ties may pick either id)


def test_build_from_the_command_line_ranks_the_text_s_rows(checkpoint, tmp_path):
    files = [text_file(checkpoint, tmp_path, "a.txt", 1), text_file(checkpoint, tmp_path, "b.txt", 2)]
    out = tmp_path / "hot.list"
    result = CliRunner().invoke(main, ["hot-rows", "build", str(checkpoint), *files, "--out", str(out),
                                       "--rows-per-layer", "50"])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.output and "12,000 tokens of 2 file(s)" in result.output
    hot = read_hot_list(str(out))
    inspected = json.loads(CliRunner().invoke(main, ["inspect", str(checkpoint), "--json"]).output)
    layouts = build_layout(EngramConfig.from_file(str(checkpoint / "config.json")))
    hot.check_against(layouts, inspected["fingerprint"])
    assert hot.built_from["files"] == files and hot.built_from["tokens"] == 12000
    check_against(hot, layouts, independent_counts(checkpoint, files), 50)


def test_chunks_continue_each_file_s_history(checkpoint, tmp_path):
    """Read in chunks of a few lines, the counts are those of each file hashed whole."""
    files = [text_file(checkpoint, tmp_path, "c.txt", 3, words=3000)]
    out = str(tmp_path / "hot.list")
    build_hot_rows(str(checkpoint), files, out, fraction=0.5, chunk_chars=200)
    hot = read_hot_list(out)
    layouts = build_layout(EngramConfig.from_file(str(checkpoint / "config.json")))
    check_against(hot, layouts, independent_counts(checkpoint, files), lambda rows: round(0.5 * rows))


def test_build_refuses_to_overwrite_and_names_bad_inputs(checkpoint, tmp_path):
    text = text_file(checkpoint, tmp_path, "a.txt", 4, words=100)
    precious = tmp_path / "notes.txt"
    precious.write_text("mine")
    runner = CliRunner()

    def run(*args):
        return runner.invoke(main, ["hot-rows", "build", *args])

    result = run(str(checkpoint), text, "--out", str(precious))
    assert result.exit_code == 1 and "exists; pass --force" in result.stderr
    result = run(str(checkpoint), text, "--out", str(precious), "--force")
    assert result.exit_code == 1 and "is not a hot-row list; not replaced, even with --force" in result.stderr
    assert precious.read_text() == "mine"
    out = tmp_path / "hot.list"
    assert run(str(checkpoint), text, "--out", str(out)).exit_code == 0
    first = out.read_bytes()
    assert run(str(checkpoint), text, "--out", str(out)).exit_code == 1
    assert run(str(checkpoint), text, "--out", str(out), "--force", "--fraction", "0.01").exit_code == 0
    assert out.read_bytes() != first and not [p for p in os.listdir(tmp_path) if ".tmp-" in p]
    result = run(str(checkpoint), str(tmp_path / "missing.txt"), "--out", str(tmp_path / "x.list"))
    assert result.exit_code == 1 and "missing.txt: no such text file" in result.stderr
    (tmp_path / "bin.txt").write_bytes(b"ok\n\xff\xfe\n")
    result = run(str(checkpoint), str(tmp_path / "bin.txt"), "--out", str(tmp_path / "x.list"))
    assert result.exit_code == 1 and "bin.txt: not UTF-8 text (line 2" in result.stderr
    assert not (tmp_path / "x.list").exists()
    result = run(str(checkpoint), text, "--out", str(tmp_path / "x.list"), "--fraction", "0.1", "--rows-per-layer", "3")
    assert result.exit_code == 2 and "not both" in result.stderr


def test_a_checkpoint_without_a_tokenizer_is_refused(tmp_path):
    out = tmp_path / "plain"
    assert CliRunner().invoke(main, ["synth", str(out), "--vocab-size", "200"]).exit_code == 0
    text = tmp_path / "t.txt"
    text.write_text("hello\n")
    result = CliRunner().invoke(main, ["hot-rows", "build", str(out), str(text), "--out", str(tmp_path / "h")])
    assert result.exit_code == 1
    assert "has no hashing section (no tokenizer.json" in result.stderr


@pytest.mark.parametrize("text, says", [
    ("", "holds no tokens"),
    ("\n  \n\n", "holds no tokens"),
    ("zzzq qqqz\nxyzzy plugh\n", "every one of the text's 4 tokens is the tokenizer's unknown token '<unk>'"),
])
def test_text_that_gives_no_known_token_is_refused_and_nothing_is_written(checkpoint, tmp_path, text, says):
    """The command as a process: an empty text, or one the tokenizer maps wholly to <unk>, is refused."""
    path = tmp_path / "t.txt"
    path.write_text(text)
    out = tmp_path / "hot.list"
    result = subprocess.run([sys.executable, "-m", "engramd", "hot-rows", "build", str(checkpoint), str(path),
                             "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("error: ") and says in result.stderr, result.stderr
    assert not out.exists() and "wrote" not in result.stdout
