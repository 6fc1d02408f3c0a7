"""engramd status's human rendering: the hashing line appears exactly when the table carries a token map."""
from __future__ import annotations

import pytest

from engramd.status_text import print_status


def status(hashing: dict | None) -> dict:
    return {"state": "ready", "error": None, "generation": 3, "boot_id": "b1", "pid": 42, "checkpoint": "/ckpt",
            "table_bytes": 3 * 2**20, "table_path": "/dev/shm/engramd/table-3",
            "layers": [{"layer": 1, "rows": 1000, "head_dim": 32, "head_sizes": [499, 501]}],
            "hashing": hashing, "reload": None, "numa_node": None, "clients": []}


def test_a_table_with_a_token_map_prints_its_hashing_facts(capsys: pytest.CaptureFixture[str]):
    print_status(status({"vocab": 400, "compressed_vocab": 311, "max_ngram": 3, "pad_token_id": 2}))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("hashing")]
    assert lines == ["hashing     400 token ids -> 311 compressed, n-grams up to 3, pad token 2"]


def test_a_table_without_a_token_map_prints_no_hashing_line(capsys: pytest.CaptureFixture[str]):
    print_status(status(None))
    out = capsys.readouterr().out
    assert "layer   1: 1000 rows x 32, 2 heads" in out
    assert "hashing" not in out
