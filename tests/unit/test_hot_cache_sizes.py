"""row_cache.part_sizes: how a layer's cache budget splits between the list's fixed part and the
recency part (HbmRowCache sizes itself with it; benchmarks/cache/policy.py replays those sizes)."""
from __future__ import annotations

from engram_client.lookup.cache.row_cache import WAYS, part_sizes

ROW = 264


def test_the_list_takes_up_to_half_and_the_recency_part_a_power_of_two_of_sets_of_the_rest():
    budget = 182_226_312  # 1% of a 65,080,826-row layer, with keys and stamps
    assert part_sizes(budget, ROW, 0) == (0, 65536)  # 650,811 slots: 81,351 sets, floored to 2**16
    fixed, sets = part_sizes(budget, ROW, 10_000_000)
    assert fixed == budget // 2 // (ROW + 8) == 334_974
    assert sets == 32768 and sets * WAYS * (ROW + 16) <= budget - fixed * (ROW + 8) < 2 * sets * WAYS * (ROW + 16)
    assert part_sizes(budget, ROW, 1000) == (1000, 65536)  # a short list takes only its rows
    assert part_sizes(WAYS * (ROW + 16) - 1, ROW, 0) == (0, 0)  # no room for one set: HbmRowCache refuses it
