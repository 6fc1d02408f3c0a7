"""``hot_cache_bytes`` means the same on both lookup paths: cache_for_view builds one HbmRowCache a
layer from it, of the same sizes and the same fixed part, whether the host path's gather pool loads
that part (``lookup_path="host"``) or torch does (``"uva"``, which has no pool).

On the CPU, with real table bytes, a real hot-row list file (core/hot_list.py) and a real gather
pool.  The mapped generation is a stand-in holding the real layer views and list: a real one
comes from a daemon's attach reply, which the cache does not read."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engram_client.attach.mapped_generation import LayerView
from engram_client.core.hot_list import encode_hot_list, read_hot_list
from engram_client.core.layout import LayerLayout
from engram_client.lookup.cache.layer_caches import cache_for_view, layer_budgets
from engram_client.lookup.cache.row_cache import part_sizes
from engram_client.lookup.config import LookupConfig
from engram_client.lookup.host.host_lookup import open_pool

LAYOUTS = [LayerLayout(1, 256, (600, 424)), LayerLayout(14, 256, (300, 212))]
BUDGET = 96 * 1024


@pytest.fixture
def generation(tmp_path):
    rng = np.random.default_rng(3)
    ranked = {layout.layer: (rng.permutation(layout.rows)[:200].astype(np.int64), np.arange(200, 0, -1))
              for layout in LAYOUTS}
    path = tmp_path / "table.hot"
    path.write_bytes(encode_hot_list("fp", LAYOUTS, ranked, {"tokens": 1}))
    views = {}
    for layout in LAYOUTS:
        rows = torch.from_numpy(rng.integers(0, 256, layout.rows * layout.row_bytes, dtype=np.uint8))
        views[layout.layer] = LayerView(layout, rows, 0, layout.rows, rows)
    return SimpleNamespace(layers=views, hot_list=read_hot_list(str(path)))


def test_both_paths_build_the_same_cache_from_hot_cache_bytes(generation):
    pool = open_pool(2)
    try:
        shares = layer_budgets(BUDGET, {layer: view.hi - view.lo for layer, view in generation.layers.items()})
        for layer, view in generation.layers.items():
            caches = {path: cache_for_view(LookupConfig(path=path, hot_cache_bytes=BUDGET), view, generation,
                                           torch.device("cpu"), pool if path == "host" else None, None)
                      for path in ("host", "uva", "auto")}
            ranked = generation.hot_list.ranked(layer)
            fixed, sets = part_sizes(shares[layer], view.layout.row_bytes, ranked.size)
            table = view.host_view.view(-1, view.layout.row_bytes)
            for path, cache in caches.items():
                assert (cache.budget_bytes, cache.fixed_count, cache.sets) == (shares[layer], fixed, sets), path
                assert cache.fixed_keys.tolist() == sorted(ranked[:fixed].tolist()), path
                assert torch.equal(cache.fixed_rows, table[cache.fixed_keys]), f"{path}: the fixed part's rows"
            assert fixed and caches["host"].nbytes == caches["uva"].nbytes == caches["auto"].nbytes
    finally:
        pool.close()


def test_no_budget_no_cache_on_any_path(generation):
    view = generation.layers[1]
    for path in ("host", "uva", "auto"):
        assert cache_for_view(LookupConfig(path=path), view, generation, torch.device("cpu"), None, None) is None
