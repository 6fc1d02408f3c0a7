"""The gather budget's plan and contracts without a daemon: CPU lists, groups per NUMA node from a
fake sysfs root (this machine has one node: a second one can only be faked), the GPU's group, the
heartbeat report's checks, and one layout shared by the C scheduler and the daemon."""
from __future__ import annotations

import fcntl
import mmap
import os
import struct

import pytest

from engram_client.lookup.host.host_lookup import _host_gather  # with the project's error classes set
from engram_client.core import budget_file
from engram_client.core.errors import ConfigError, EngramError, ProtocolError
from engram_client.lookup.host.gather_seat import GatherSeat, choose_group, format_cpus, take_seat
from engramd.daemon.gather_budget import check_spec, client_report, format_cpu_list, parse_cpu_list, plan_groups
from fake_sysfs import fake_sysfs
from test_gather_budget_wakes import WANT_MASK_AT


def test_cpu_lists_parse_and_format_both_ways():
    assert parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpu_list([0, 1, 2, 3, 8, 10, 11]) == format_cpus([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    for bad, why in (("0-", "is not a CPU number"), ("3-1", "empty"), ("a", "is not a CPU number"), ("", "is not")):
        with pytest.raises(ConfigError, match=why):
            parse_cpu_list(bad)
    for bad in ("0%", "101%", "x%"):
        with pytest.raises(ConfigError, match="a share is a percentage"):
            check_spec(bad)
    check_spec("off"), check_spec("50%"), check_spec("0-7")


def test_the_default_leaves_one_cpu_per_gpu_on_each_node(tmp_path):
    sysfs = fake_sysfs(tmp_path, {0: "0-7", 1: "8-15"},
                       {"0000:17:00.0": 0, "0000:18:00.0": 0, "0000:97:00.0": 1, "0000:98:00.0": 1})
    groups = plan_groups(None, sysfs, allowed=list(range(16)))
    assert [(g.node, g.cpus) for g in groups] == [(0, tuple(range(6))), (1, tuple(range(8, 14)))]


def test_no_gpu_leaves_one_cpu_and_a_share_or_a_list_is_taken_as_given(tmp_path):
    sysfs = fake_sysfs(tmp_path, {0: "0-3", 1: "4-7"}, {})
    assert [g.cpus for g in plan_groups(None, sysfs, allowed=list(range(8)))] == [(0, 1, 2, 3), (4, 5, 6)]
    assert [g.cpus for g in plan_groups("50%", sysfs, allowed=list(range(8)))] == [(0, 1), (4, 5)]
    assert [(g.node, g.cpus) for g in plan_groups("2-5", sysfs, allowed=list(range(8)))] == [(0, (2, 3)), (1, (4, 5))]
    assert plan_groups("off", sysfs) == []
    with pytest.raises(ConfigError, match="CPUs 9 are not among the CPUs this daemon may use"):
        plan_groups("7,9", sysfs, allowed=list(range(8)))


def test_a_rank_takes_its_gpus_node_else_the_group_of_its_cpus():
    groups = [{"group": 0, "node": 0, "cpus": [0, 1, 2], "tokens": 3},
              {"group": 1, "node": 1, "cpus": [3, 4, 5], "tokens": 3}]
    assert choose_group(groups, 1, {0, 1, 2})["group"] == 1  # the GPU's node wins over where the rank runs
    assert choose_group(groups, None, {3, 4})["group"] == 1
    assert choose_group(groups, None, {9})["group"] == 0  # nothing in common: the first


def test_without_a_budget_the_pool_is_sized_alone_and_says_so():
    seat = take_seat(None, "cpu", None, alone_default=5)
    assert seat.threads == 5 and seat.budget is None and seat.report() is None
    assert "no node gather budget" in seat.explanation
    assert take_seat(None, "cpu", 3, alone_default=5).threads == 3


def test_a_heartbeat_report_is_checked_field_by_field():
    good = {"slot": 1, "group": 0, "tokens": 15, "threads": 15, "cpus": "0-14", "held": 2, "rows": 10, "wait_s": 1,
            "acquired": 3, "yields": 0, "overdraft": 0}
    assert client_report(good)["wait_s"] == 1.0 and client_report(None) is None
    for bad, why in (({**good, "extra": 1}, "map of the budget counters|unknown field"), ({"rows": -1}, "between 0"),
                     ({"rows": 2**63}, "between 0"), ({"held": True}, "must be int"), ({"cpus": "0" * 300}, "longer"),
                     ({"wait_s": "x"}, "must be float"), ([], "must be a map")):
        with pytest.raises(ProtocolError, match=why):
            client_report(bad)


def test_a_heartbeat_report_carries_stand_ins_only_to_a_daemon_that_knows_them():
    fd = budget_file.create([2])
    try:
        seat = GatherSeat(2, "words", budget=_host_gather.NodeBudget(fd, 0, 2, budget_file.MAX_SLOTS))
        assert "stand_ins" not in seat.report(None) and "stand_ins" not in seat.report((1, 5))
        report = seat.report((1, 6))
        assert report["stand_ins"] == 0 and client_report(report) == report  # a 1.6 daemon takes it
        assert set(seat.report((1, 5))) | {"stand_ins"} == set(report)
    finally:
        os.close(fd)


def test_a_heartbeat_report_carries_the_spares_counts_only_to_a_daemon_that_knows_them():
    fd = budget_file.create([2], decode=[1], flags=budget_file.FLAG_SPARES_QUIET)
    try:
        seat = GatherSeat(2, "words", budget=_host_gather.NodeBudget(fd, 0, 2, budget_file.MAX_SLOTS, decode=1))
        assert "spare_blocks" not in seat.report((1, 9))  # no pool open yet: nothing to count
        pool = seat.open_pool()
        try:
            assert not {"spare_blocks", "spare_asides"} & set(seat.report((1, 8)))
            report = seat.report((1, 9))
            assert (report["spare_blocks"], report["spare_asides"]) == pool.spare_counts
            assert client_report(report) == report  # a 1.9 daemon takes them
        finally:
            pool.close()
    finally:
        os.close(fd)


def test_a_group_rotates_one_token_per_20_ms_over_its_tokens_and_serves_every_waiter_within_the_starve_bound():
    """A rotation hands a token's thread to another process, whose rows start cold: a group of T tokens
    rotates one per 20 ms / T, never more often than every 1 ms, and with many slots waiting their turn
    often enough that each is served well inside the 1 s after which a slot holding nothing gathers
    without tokens: 1 s / (4 x active slots) at most (engine/budget.c, nb_quantum_ns)."""
    for tokens, quantum_ns in ((1, 20_000_000), (4, 5_000_000), (15, 1_333_333), (52, 1_000_000)):
        fd = budget_file.create([tokens])
        try:
            assert _host_gather.NodeBudget(fd, 0, tokens, budget_file.MAX_SLOTS).quantum_ns == quantum_ns, tokens
        finally:
            os.close(fd)
    fd = budget_file.create([1])
    try:
        budget = _host_gather.NodeBudget(fd, 0, 1, budget_file.MAX_SLOTS)
        with mmap.mmap(fd, budget_file.FILE_BYTES) as mapped:  # 60 other slots say they want the token
            struct.pack_into("<Q", mapped, WANT_MASK_AT, (1 << 60) - 1 << 1)
            assert budget.quantum_ns == 1_000_000_000 // (4 * 61)
            struct.pack_into("<Q", mapped, WANT_MASK_AT, 0)
        assert budget.quantum_ns == 20_000_000
    finally:
        os.close(fd)


def test_the_c_scheduler_and_the_daemon_share_one_layout():
    assert (_host_gather.BUDGET_VERSION, _host_gather.BUDGET_FILE_BYTES, _host_gather.BUDGET_MAX_SLOTS,
            _host_gather.BUDGET_MAX_GROUPS, _host_gather.BUDGET_MAX_TOKENS, _host_gather.BUDGET_FLAG_PREFILL_IDLE,
            _host_gather.BUDGET_FLAG_NO_SPARES, _host_gather.BUDGET_FLAG_SPARES_QUIET,
            _host_gather.BUDGET_GROUP_DECODE_AT, _host_gather.BUDGET_DECODE_QUIET_NS) == \
        (budget_file.VERSION, budget_file.FILE_BYTES, budget_file.MAX_SLOTS, budget_file.MAX_GROUPS,
         budget_file.MAX_TOKENS, budget_file.FLAG_PREFILL_IDLE, budget_file.FLAG_NO_SPARES,
         budget_file.FLAG_SPARES_QUIET, budget_file.GROUP_DECODE_AT, budget_file.DECODE_QUIET_NS)


def test_a_budget_is_sealed_and_a_rank_refuses_one_that_is_not(tmp_path):
    fd = budget_file.create([3, 2])
    try:
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & budget_file.SEALS == budget_file.SEALS
        with pytest.raises(OSError):
            os.ftruncate(fd, 0)
        view = budget_file.BudgetView(fd)
        assert (view.groups, view.tokens) == (2, [3, 2])
        view.close()
        with pytest.raises(EngramError, match="announced with a group, tokens, slots or small rows out of range"):
            _host_gather.NodeBudget(fd, budget_file.MAX_GROUPS, 2, budget_file.MAX_SLOTS)
        os.pwrite(fd, (0).to_bytes(4, "little"), 16)  # groups = 0: what any rank may write over the header
        budget = _host_gather.NodeBudget(fd, 1, 2, budget_file.MAX_SLOTS, small_rows=100)  # the announcement holds
        assert (budget.group, budget.tokens, budget.slot, budget.small_rows) == (1, 2, 0, 100)
    finally:
        os.close(fd)
    plain = os.open(tmp_path / "plain", os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(plain, budget_file.FILE_BYTES)
    with pytest.raises(EngramError, match="not sealed against shrinking"):
        _host_gather.NodeBudget(plain, 0, 1, budget_file.MAX_SLOTS)
    os.close(plain)


def test_a_rank_without_a_seat_says_so_to_any_daemon_status_and_the_metrics():
    from engramd.reporting.budget_metrics import budget_families
    from engramd.reporting.status_text import _client_budget

    group = {"group": 0, "node": 0, "cpus": [0, 1], "tokens": 2}
    seat = GatherSeat(1, "no seat", None, group, [0, 1], "b1", seatless=True)
    report = seat.report((1, 3))
    assert report == {"group": 0, "tokens": 2, "threads": 1, "cpus": "0-1"} and client_report(report) == report
    assert _client_budget(report).startswith("gather budget: no seat") and "1 thread of its own" in _client_budget(report)
    assert GatherSeat(3, "no budget").report((1, 6)) is None  # no budget at all: nothing to report
    status = {"clients": [{"id": "c1", "rank": None, "budget": report},
                          {"id": "c2", "rank": 0, "budget": {**report, "slot": 4}}]}
    seated = next(f for f in budget_families(status) if f.name == "engramd_client_gather_seated")
    assert {s.labels["client"]: s.value for s in seated.samples} == {"c1": 0, "c2": 1}
