"""LookupConfig: every lookup option checked in one place, frozen, and the rule "auto" follows."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from engram_client.lookup.config import LookupConfig, default_gather_threads


def test_defaults_are_valid_and_the_config_is_frozen():
    config = LookupConfig()
    assert (config.path, config.strategy, config.out_dtype, config.strict_ids) == ("auto", "auto", torch.bfloat16,
                                                                                    False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.path = "uva"
    assert dataclasses.replace(config, path="uva").path == "uva" and config.path == "auto"
    assert 1 <= default_gather_threads() <= 16


@pytest.mark.parametrize("options, message", [
    ({"path": "gpu"}, "lookup_path must be one of auto, host, uva, got 'gpu'"),
    ({"strategy": "sorted"}, "lookup strategy must be one of auto, dedup, direct"),
    ({"out_dtype": torch.float16}, "out_dtype must be torch.bfloat16 or torch.float32"),
    ({"max_programs": 0}, "max_programs must be a positive int or None"),
    ({"block_rows": 24}, "block_rows must be a power of two, got 24"),
    ({"num_warps": 0}, "num_warps must be a power of two"),
    ({"wait_timeout": -1.0}, "lookup_timeout must be positive seconds"),
    ({"gather_threads": 0}, "gather_threads must be an int from 1 to 1024, got 0"),
    ({"gather_threads": 2.5}, "gather_threads must be an int"),
    ({"hot_cache_bytes": -1}, "hot_cache_bytes must be a non-negative int"),
    ({"decode_path": "gpu"}, "decode_path must be None, 'host' or 'uva', got 'gpu'"),
    ({"decode_path": "uva", "hot_cache_bytes": 1 << 20}, "decode_path 'uva' serves no HBM row cache"),
])
def test_each_bad_option_is_named(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        LookupConfig(**options)


def test_auto_takes_the_host_path_unless_the_uva_kernel_is_clearly_faster():
    for threads in (4, 8, 15):  # enough rows in flight: the host path for every size
        config = LookupConfig(gather_threads=threads)
        assert [config.choose_path(n) for n in (1, 6144, 49152, 393216, 10**8)] == ["host"] * 5
    one = LookupConfig(gather_threads=1)
    assert one.choose_path(2000) == "host" and one.choose_path(6144) == "uva" and one.choose_path(393216) == "uva"
    two = LookupConfig(gather_threads=2)
    assert two.choose_path(6144) == "host" and two.choose_path(49152) == "uva"
    assert LookupConfig(path="uva").choose_path(10) == "uva"
    assert LookupConfig(path="host", gather_threads=1).choose_path(10**8) == "host"
    assert LookupConfig(hot_cache_bytes=1 << 20).choose_path(10**6) == "host"  # the HBM cache fronts the gather
    assert LookupConfig(hot_cache_bytes=1 << 20, path="uva").choose_path(10) == "uva"  # the same cache, its own fetch


def test_decode_path_picks_the_path_of_decode_size_calls_only():
    """At most DECODE_ROWS ids (the budget's small_rows) is decode-size: decode_path takes those, and
    every larger call follows lookup_path as before; unset, nothing changes."""
    from engram_client.core.budget_file import SMALL_ROWS
    from engram_client.lookup.config import DECODE_ROWS

    assert DECODE_ROWS == SMALL_ROWS
    uva = LookupConfig(path="host", decode_path="uva")
    assert [uva.choose_path(n) for n in (1, 6144, DECODE_ROWS, DECODE_ROWS + 1, 393216)] == ["uva"] * 3 + ["host"] * 2
    host = LookupConfig(path="uva", decode_path="host")
    assert host.choose_path(6144) == "host" and host.choose_path(DECODE_ROWS + 1) == "uva"
    assert LookupConfig(gather_threads=1).choose_path(6144) == "uva"  # unset: "auto" decides as before
    assert LookupConfig(decode_path="host", hot_cache_bytes=1 << 20).choose_path(6144) == "host"
    # the gather pool is made where some call may take the host path
    assert [LookupConfig(path=p, decode_path=d).takes_host_path for p, d in
            (("uva", None), ("uva", "uva"), ("uva", "host"), ("host", "uva"), ("auto", None))] == [False, False] + [True] * 3
    # captures go to the kernel only where "uva" is asked for by name
    assert [LookupConfig(path=p, decode_path=d).captures_uva for p, d in
            (("uva", None), ("host", "uva"), ("auto", None), ("host", None), ("uva", "host"))] == [True] * 2 + [False] * 2 + [True]


def test_a_cpu_client_refuses_a_decode_path_before_reaching_any_daemon(tmp_path):
    from engram_client import EngramClient

    with pytest.raises(ValueError, match="decode_path='uva' picks a GPU path; a CPU client's lookups all run on the CPU"):
        EngramClient(endpoint=f"ipc://{tmp_path}/engramd.sock", device="cpu", decode_path="uva")


def test_the_old_uva_cache_refresh_setting_is_refused_by_name(tmp_path):
    """One HBM cache serves both paths now, with nothing to refresh: the setting the UVA path's own
    cache had is refused, not ignored (no socket is opened: the refusal comes first)."""
    from engram_client import EngramClient

    with pytest.raises(TypeError, match="hot_cache_refresh_every"):
        LookupConfig(hot_cache_refresh_every=16)
    with pytest.raises(ValueError, match="hot_cache_refresh_every is gone: the HBM cache has no refresh"):
        EngramClient(endpoint=f"ipc://{tmp_path}/engramd.sock", device="cpu", hot_cache_refresh_every=16)
