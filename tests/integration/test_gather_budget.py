"""The node's gather budget with real rank processes against a real daemon (device="cpu" lookups run
the same C gather as the host path): never more gathering threads than tokens, a lone rank takes
them all, small calls first, round robin, a rank killed mid-lookup, a peer that takes or
scribbles over the budget.  Every property is read from counters or the grant log the budget
keeps in its shared memory, or from the kernel's lock table: no timing asserts."""
from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from engram_client.core import budget_file
from budget_ranks import budget_fd, watcher
from waiting import wait_for


def test_busy_ranks_never_gather_on_more_threads_than_tokens(budget_daemon, ranks):
    daemon = budget_daemon("0-1")  # 2 tokens; each rank starts 4 threads
    group = ranks(daemon.endpoint, [(65536, 8, 4)] * 3)
    assert all(r["threads"] == 4 and "gather_threads=4" in r["words"] for r in group.ready)
    group.go()
    results = group.results()
    state = watcher(daemon).group_state()
    assert state["peak"] == 2, state  # never more than the budget, and all of it used
    assert all(r["stats"]["overdraft"] == 0 for r in results), results
    assert sum(r["stats"]["wait_s"] for r in results) > 0 and state["locked"] == 0 and state["held"] == 0, state


def test_a_rank_alone_takes_every_token_and_status_reports_its_share(budget_daemon, ranks):
    daemon = budget_daemon("0-1")
    group = ranks(daemon.endpoint, [(65536, 4, 0)])
    assert group.ready[0]["threads"] == 2 and "so alone it may use 2 tokens" in group.ready[0]["words"]
    group.go()
    (result,) = group.results()
    assert watcher(daemon).group_state()["peak"] == 2  # work-conserving: a lone rank gets the whole budget
    assert result["stats"]["rows"] >= 4 * 65536


def test_status_shows_each_clients_budget_counters(budget_daemon, ranks):
    daemon = budget_daemon("0")
    group = ranks(daemon.endpoint, [(4096, 0, 0), (4096, 0, 0)])
    group.go()

    def reported():
        clients = daemon.status()["clients"]
        return len(clients) == 2 and all((c.get("budget") or {}).get("rows", 0) > 0 for c in clients) and clients
    clients = wait_for(reported, "both clients' budget counters in status", 30)
    assert sorted(c["budget"]["slot"] for c in clients) == sorted(r["slot"] for r in group.ready)
    assert all(c["budget"]["cpus"] == "0" and c["budget"]["tokens"] == 1 for c in clients)
    text = subprocess.run([sys.executable, "-m", "engramd", "status", "--socket", daemon.endpoint],
                          capture_output=True, text=True, timeout=30).stdout
    assert "node budget of 1 token," in text and "rows gathered" in text and "waited for tokens" in text, text
    group.stop()
    group.results()


def test_a_decode_call_waits_at_most_a_block_per_token_behind_a_prefill(budget_daemon, ranks):
    daemon = budget_daemon("0")  # one token: the decode rank can only run when the prefill rank gives it up
    group = ranks(daemon.endpoint, [(393216, 0, 2), (6144, 0, 2)])
    fd = budget_fd(daemon)
    view = budget_file.BudgetView(fd)
    group.go()
    decoder = group.ready[1]["slot"]
    # Until the decode rank has had to wait for the token a few times (the prefill rank held it).
    wait_for(lambda: view.slot(decoder)["small_waits"] >= 5, "decode calls that waited behind the prefill", 120)
    group.stop()
    prefill, decode = group.results()
    stats = decode["stats"]
    # A prefill call is 3,072 blocks; it gives the token back at the next block boundary.
    assert stats["small_waits"] >= 5 and stats["small_wait_blocks_max"] <= 2, stats
    assert prefill["stats"]["overdraft"] == decode["stats"]["overdraft"] == 0, (prefill, decode)
    view.close()
    os.close(fd)


def test_busy_ranks_are_served_round_robin(budget_daemon, ranks):
    daemon = budget_daemon("0")
    group = ranks(daemon.endpoint, [(131072, 6, 2)] * 3)
    group.go()
    group.results()
    budget = watcher(daemon)
    log = [entry for entry in budget.grant_log() if entry[4] == 0]  # (seq, slot, token, small, how, held, want, ..)
    assert {entry[1] for entry in log} == {r["slot"] for r in group.ready}
    assert budget.group_state()["breaks"] == 0, "a decision lock was taken over: the log cannot be judged"
    # With one token, the slot just served may take it again only if nobody else waited at that decision.
    passed_over = [(a, b) for a, b in zip(log, log[1:]) if a[1] == b[1] and b[6] & ~(1 << b[1])]
    assert not passed_over, f"a slot was served twice in a row while another waited: {passed_over[:3]}"
    assert sum(1 for a, b in zip(log, log[1:]) if a[1] != b[1]) >= 6, "the token never went round"


@pytest.mark.parametrize("prefill_gathers", ["normal", "idle"])  # idle: the token held is a crew thread's
def test_a_rank_killed_mid_lookup_gives_its_token_back_and_others_stay_exact(budget_daemon, ranks, prefill_gathers):
    daemon = budget_daemon("0", "--prefill-gathers", prefill_gathers)
    group = ranks(daemon.endpoint, [(1 << 20, 0, 2), (8192, 0, 2)])
    budget = watcher(daemon)
    victim, proc = group.ready[0]["slot"], group.procs[0]
    fd = budget_fd(daemon)
    view = budget_file.BudgetView(fd)
    group.go()

    def frozen_holding() -> bool:  # stop it where it holds the token, then kill it there
        if view.slot(victim)["held"] <= 0:
            return False
        proc.send_signal(signal.SIGSTOP)
        if view.slot(victim)["held"] > 0:
            return True
        proc.send_signal(signal.SIGCONT)
        return False
    wait_for(frozen_holding, "the big rank stopped while holding the token", 60)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    # The kernel released its lock with the process; its hints stay until the survivor, waiting, sweeps them.
    wait_for(lambda: view.slot(victim)["held"] == 0 and budget.group_state()["sweeps"] >= 1,
             "the dead rank's slot swept", 30)
    wait_for(lambda: daemon.status()["clients_total"] == 1, "the dead rank's lease to expire", 30)
    group.stop([1])
    (survivor,) = group.results([1])
    assert survivor["stats"]["overdraft"] == 0, survivor  # the token came back: no need to gather without one
    if prefill_gathers == "normal":  # no crew, so nobody to stand in for
        assert survivor["stats"]["stand_ins"] == 0, survivor
    # Under idle the survivor may have stood in for the stopped crew thread (not asserted either way:
    # whether it waited 3 ms for that token depends on when the victim was stopped).
    assert budget.group_state()["locked"] == 0
    view.close()
    os.close(fd)


def test_a_peer_that_takes_every_token_stalls_a_rank_only_boundedly(budget_daemon, ranks):
    daemon = budget_daemon("0-1")
    hoarder = budget_fd(daemon)  # a peer that locks every token outside the protocol and never lets go
    assert all(budget_file.lock_token(hoarder, 0, t) for t in range(2))
    assert daemon.status()["gather_budget"]["groups"][0]["locked"] == 2
    group = ranks(daemon.endpoint, [(16384, 5, 2)])
    group.go()
    (result,) = group.results()
    assert result["stats"]["overdraft"] >= 1, result  # it gathered without tokens rather than wait forever
    os.close(hoarder)
    wait_for(lambda: daemon.status()["gather_budget"]["groups"][0]["locked"] == 0, "the hoarder's locks to go", 10)


def test_a_peer_that_scribbles_over_the_budget_cannot_break_a_rank(budget_daemon, ranks):
    daemon = budget_daemon("0-1")
    group = ranks(daemon.endpoint, [(16384, 5, 2)] * 2)
    fd = budget_fd(daemon)
    mapped = mmap.mmap(fd, budget_file.FILE_BYTES)
    with pytest.raises(OSError):
        os.ftruncate(fd, 0)  # sealed: nobody can pull the pages from under a rank
    noise = np.random.default_rng(5).integers(0, 256, budget_file.FILE_BYTES - budget_file.SLOTS_AT, dtype=np.uint8)
    mapped[budget_file.SLOTS_AT:] = noise.tobytes()  # every slot, lock word, mask, owner hint and log entry
    group.go()
    group.results()  # every call made, every row exact, no error
    assert "refused request" not in daemon.log(), "a garbled counter made a heartbeat the daemon refused"
    mapped.close()
    os.close(fd)


def test_ranks_gather_through_a_daemon_kill_and_move_to_the_next_daemons_budget(budget_daemon, ranks):
    first = budget_daemon("0")
    group = ranks(first.endpoint, [(8192, 0, 2)])
    old = watcher(first)
    group.go()
    wait_for(lambda: old.group_state()["grants"] > 0, "gathers on the first daemon's budget", 30)
    first.kill(signal.SIGKILL)
    grants = old.group_state()["grants"]
    wait_for(lambda: old.group_state()["grants"] > grants, "gathers on the old budget with no daemon", 30)
    second = budget_daemon("0")  # same socket: it re-adopts
    new = watcher(second)
    wait_for(lambda: new.group_state()["grants"] > 0, "the rank's pool on the new daemon's budget", 30)
    wait_for(lambda: (second.status()["clients"] or [{}])[0].get("budget"), "its counters in the new status", 30)
    group.stop()
    group.results()


def test_prefill_gathers_is_checked_before_anything_starts(tmp_path):
    run = subprocess.run([sys.executable, "-m", "engramd", "serve", "--gather-cpus", "off",
                          "--prefill-gathers", "idle", "--socket", f"ipc://{tmp_path}/s.sock",
                          "--shm-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "--prefill-gathers idle is a rule of the node's gather budget" in run.stderr, run
    run = subprocess.run([sys.executable, "-m", "engramd", "serve", "--prefill-gathers", "low",
                          "--socket", f"ipc://{tmp_path}/s.sock", "--shm-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "'low' is not one of" in run.stderr, run
