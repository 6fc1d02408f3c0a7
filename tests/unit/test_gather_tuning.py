"""The C gather's tuning knobs (set_tuning): every prefetch setting and the streaming stores
copy the same bytes, bad ids stay zeroed, and a setting outside the allowed ranges is refused.

The knobs change only how rows are fetched and written, so each case is compared byte for byte
with numpy's fancy indexing; the defaults are restored after each test."""
from __future__ import annotations

import numpy as np
import pytest

from engram_client.lookup.host import _host_gather
from engram_client.lookup.host.host_lookup import open_pool

ROWS = 4000


@pytest.fixture
def restore_tuning():
    default = _host_gather.get_tuning()
    yield default
    _host_gather.set_tuning(*default)


def gathered(pool, table: np.ndarray, ids: np.ndarray, row_lo: int, row_hi: int) -> tuple[np.ndarray, int]:
    out = np.full((ids.size, table.shape[1]), 0xAB, dtype=np.uint8)
    bad = pool.gather(table.ctypes.data, row_lo, row_hi, table.shape[1], ids.ctypes.data, ids.dtype == np.int64,
                      ids.size, out.ctypes.data, 0)
    return out, bad


def test_the_defaults_prefetch_whole_rows_ahead_with_a_cache_hint(restore_tuning):
    near, far, hint, streaming = restore_tuning
    assert near > 0 and far == 0 and 0 <= hint <= 3 and streaming is False


@pytest.mark.parametrize("setting", [(16, 0, 0, False), (0, 0, 3, False), (8, 64, 3, False), (16, 0, 3, True),
                                     (4, 48, 1, True), (1, 2, 2, True)])
@pytest.mark.parametrize("row_bytes", [264, 520, 100])  # V4.1 rows, a larger row, one not a multiple of 8
def test_every_setting_copies_the_same_bytes(restore_tuning, setting, row_bytes):
    _host_gather.set_tuning(*setting)
    assert _host_gather.get_tuning() == setting
    table = np.random.default_rng(row_bytes).integers(0, 256, (ROWS, row_bytes), dtype=np.uint8)
    rng = np.random.default_rng(sum(setting))
    pool = open_pool(3)
    try:
        for n in (1, 33, 5000, 40000):  # one row, a block and a bit, many blocks of both sizes
            ids = rng.integers(0, ROWS, n)
            out, bad = gathered(pool, table, ids, 0, ROWS)
            assert bad == 0
            np.testing.assert_array_equal(out, table[ids])
        # Bad ids are zeroed whatever the stores: a range that starts inside the table.
        ids = np.array([10, 9, 3999, 4000, -5, 2000] * 50, dtype=np.int32)
        out, bad = gathered(pool, table[10:3000], ids, 10, 3000)
        valid = (ids >= 10) & (ids < 3000)
        assert bad == int((~valid).sum())
        np.testing.assert_array_equal(out[valid], table[ids[valid]])
        assert not out[~valid].any()
    finally:
        pool.close()


@pytest.mark.parametrize("setting", [(-1, 0, 0, False), (257, 0, 0, False), (16, 16, 0, False), (16, 8, 0, False),
                                     (16, 1025, 0, False), (16, 0, 4, False), (16, 0, -1, False)])
def test_a_setting_out_of_range_is_refused_and_changes_nothing(restore_tuning, setting):
    with pytest.raises(ValueError, match="prefetch of whole rows"):
        _host_gather.set_tuning(*setting)
    assert _host_gather.get_tuning() == restore_tuning
