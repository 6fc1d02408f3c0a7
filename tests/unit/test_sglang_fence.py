"""The SGLang plugin's fence and split: SGLang 0.5.23's surface as the stand-in holds it, read both ways.

The live reader imports the stand-in (tests/support/sglang_standin, SGLang's module paths and
signatures); the source reader parses the same files as scripts/check_engines.py parses the
real wheel (which passes the same fence: run it on sglang-0.5.23's wheel).  Both must give the
same verdict on every item, and a change to one item must fail in both.
"""
from __future__ import annotations

import importlib
import os
import sys

import pytest

from engram_client import IntegrationError
from engram_client.integrations.engine_fence import ENGINES, check_live, engine_fences
from engram_client.integrations.fence_sources import check_sources
from engram_client.integrations.sglang.fences import FENCES
from engram_client.integrations.sglang.column_split import column_split
from sglang_ranks import STANDIN


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """The stand-in, copied so a test may change it, importable as ``sglang``; its source reader."""
    import shutil

    root = tmp_path / "standin"
    shutil.copytree(STANDIN, root)
    monkeypatch.syspath_prepend(str(root))
    saved = {name: module for name, module in sys.modules.items() if name.partition(".")[0] == "sglang"}
    for name in saved:
        del sys.modules[name]
    yield root
    for name in [name for name in sys.modules if name.partition(".")[0] == "sglang"]:
        del sys.modules[name]
    sys.modules.update(saved)


def read_from(root):
    def read(module: str):
        base = os.path.join(root, *module.split("."))
        for path in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.exists(path):
                with open(path) as f:
                    return f.read()
        return None

    return read


def verdicts(findings):
    return [(f.kind, f.module, f.item, f.ok) for f in findings]


def test_sglang_is_an_engine_with_a_fence_for_0_5_23():
    assert "sglang" in ENGINES and sorted(engine_fences("sglang")) == ["0.5.23"]


def test_both_readers_pass_the_standins_surface_item_by_item(standin):
    fence = FENCES["0.5.23"]
    live, static = check_live(fence, importlib.import_module), check_sources(fence, read_from(standin))
    assert verdicts(live) == verdicts(static)
    assert all(f.ok for f in live), [f.line() for f in live if not f.ok]
    assert len(live) == 34


def test_a_lookup_that_no_longer_ends_in_owned_rows_fails_in_both_readers(standin):
    engram = standin / "sglang" / "srt" / "layers" / "engram.py"
    engram.write_text(engram.read_text().replace("values = self._owned_rows(indices)\n", "values = indices\n"))
    fence = FENCES["0.5.23"]
    live = [f for f in check_live(fence, importlib.import_module) if not f.ok]
    static = [f for f in check_sources(fence, read_from(standin)) if not f.ok]
    assert verdicts(live) == verdicts(static) == [("calls", "sglang.srt.layers.engram", "EngramEmbedding._lookup",
                                                   False)]
    assert "no longer uses _owned_rows" in live[0].line()


@pytest.mark.parametrize("columns, tp, expected", [(8, 2, [(0, 4), (4, 4)]), (8, 8, [(r, 1) for r in range(8)]),
                                                   (6, 3, [(0, 2), (2, 2), (4, 2)]), (8, 1, [(0, 8)])])
def test_each_rank_gets_whole_columns_as_sglangs_shard_range_gives_them(columns, tp, expected):
    assert [column_split(columns, rank, tp) for rank in range(tp)] == expected


def test_a_tp_size_that_splits_columns_is_refused_naming_both():
    with pytest.raises(IntegrationError, match=r"TP size 3 does not divide an Engram layer's 8 hash columns.*"
                                               r"divides 8\. Unset ENGRAMD_SGLANG"):
        column_split(8, 0, 3)
