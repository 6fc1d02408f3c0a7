"""`engramd synth --tokenizer-vocab`: a checkpoint whose tokenizer the daemon reads and checks."""
from __future__ import annotations

import json

from click.testing import CliRunner

from engramd.cli.main import main
from engramd.loading.token_map import compressed_map


def test_synth_writes_a_tokenizer_and_its_config_fields(tmp_path):
    out = tmp_path / "synth"
    result = CliRunner().invoke(main, ["synth", str(out), "--vocab-size", "200", "--tokenizer-vocab", "300"])
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    token_map, compressed = compressed_map(str(out / "tokenizer.json"))
    assert token_map.size == 300 and config["engram_compressed_vocab_size"] == compressed < 300
    assert config["engram_pad_token_id"] == 2


def test_synth_refuses_a_tiny_tokenizer_before_writing(tmp_path):
    out = tmp_path / "synth"
    result = CliRunner().invoke(main, ["synth", str(out), "--vocab-size", "200", "--tokenizer-vocab", "5"])
    assert result.exit_code == 1
    assert "error: --tokenizer-vocab must be at least 16, got 5" in result.stderr
    assert not out.exists()
