"""Decode CPUs (engramd --decode-cpus) with real rank processes against a real daemon on this
machine's two CPUs, one of them kept for decode-size calls: status says which, every rank's
prefill crew runs off it at normal priority with a spare at SCHED_IDLE on it, prefill-size jobs
of two ranks never hold the token kept for decode, a rank killed mid-lookup gives its token back,
and a decoding rank keeps its token while a prefill holder is frozen.  Read from the kernel's
thread table, the budget's counters and its grant log: no timing asserts."""
from __future__ import annotations

import mmap
import os
import signal
import struct
import subprocess
import sys

import pytest

from engram_client.core import budget_file
from budget_ranks import budget_fd, watcher
from decode_claim import DecodeClaim
from waiting import wait_for

PEAK_AT = budget_file.GROUPS_AT + 9 * 8 + 4  # NbGroup: lock .. sweeps (9 words), gathering, peak
pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to keep one for decode")


def crew_threads(pid: int) -> dict[str, set]:
    """Policy and CPUs of each prefill crew thread and spare of process ``pid``, by thread name."""
    found: dict[str, set] = {"engram-prefill": set(), "engram-spare": set()}
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/comm") as f:
            name = f.read().strip()
        if name in found:
            found[name].add((os.sched_getscheduler(int(task)), frozenset(os.sched_getaffinity(int(task)))))
    return found


def status_text(daemon) -> str:
    return subprocess.run([sys.executable, "-m", "engramd", "status", "--socket", daemon.endpoint],
                          capture_output=True, text=True, timeout=30).stdout


def test_decode_cpus_keep_every_ranks_prefill_off_them_and_off_the_last_token(budget_daemon, ranks):
    daemon = budget_daemon("0-1", "--decode-cpus", "1")
    (status,) = daemon.status()["gather_budget"]["groups"]
    assert status["decode_tokens"] == 1 and status["decode_cpus"] == "1", status
    text = subprocess.run([sys.executable, "-m", "engramd", "status", "--socket", daemon.endpoint],
                          capture_output=True, text=True, timeout=30).stdout
    assert "decode CPUs 1 (no prefill gather of normal priority there" in text, text
    assert "prefill spares at SCHED_IDLE while no rank decodes: " in text, text  # --decode-spares quiet, the default
    group = ranks(daemon.endpoint, [(65536, 0, 0), (65536, 0, 0)])
    for ready in group.ready:
        assert "gathered by 1 thread kept off the decode CPUs 1, with 1 spare at SCHED_IDLE there, standing aside " \
            "while a rank of the group decodes (--decode-spares quiet)" in ready["words"], ready
        assert crew_threads(ready["pid"]) == {"engram-prefill": {(os.SCHED_OTHER, frozenset({0}))},
                                              "engram-spare": {(os.SCHED_IDLE, frozenset({1}))}}
    fd = budget_fd(daemon)
    view, mapped = budget_file.BudgetView(fd), mmap.mmap(fd, budget_file.FILE_BYTES)
    struct.pack_into("<i", mapped, PEAK_AT, 0)  # the ranks' first lookups were decode-size: count from here
    group.go()
    slots = [r["slot"] for r in group.ready]
    wait_for(lambda: all(view.slot(s)["rows"] >= 8 * 65536 for s in slots), "both ranks' prefill rows", 180)
    # What a rank's spare gathered on the idle decode CPU reaches status through its heartbeats (1.9).
    wait_for(lambda: any((c.get("budget") or {}).get("spare_blocks", 0) >= 1 for c in daemon.status()["clients"]),
             "a rank's heartbeat to report its spare's prefill blocks", 60)
    assert "spares on the decode CPUs gathered " in status_text(daemon)
    group.stop()
    results = group.results()
    state = watcher(daemon).group_state()
    assert state["peak"] == 1, state  # two ranks' crews on two tokens: the one kept for decode never taken
    assert all(r["stats"]["overdraft"] == 0 for r in results), results
    # Status says whether the quiet spares stand aside now, while a decoding rank's stamps are claimed
    # (every few ms, so that no window is raced).
    with DecodeClaim(mapped):
        wait_for(lambda: daemon.status()["gather_budget"]["groups"][0]["decoding"], "status to say a rank decodes", 30)
        assert "prefill spares at SCHED_IDLE while no rank decodes: standing aside now, a rank decodes)" in status_text(daemon)
    wait_for(lambda: not daemon.status()["gather_budget"]["groups"][0]["decoding"], "the decode window to close", 30)
    assert "prefill spares at SCHED_IDLE while no rank decodes: free to gather now)" in status_text(daemon)
    mapped.close()
    view.close()
    os.close(fd)


def test_a_prefill_rank_frozen_then_killed_mid_lookup_leaves_decode_its_token(budget_daemon, ranks):
    daemon = budget_daemon("0-1", "--decode-cpus", "1")
    group = ranks(daemon.endpoint, [(1 << 20, 0, 0), (65536, 0, 0), (6144, 0, 0)])
    victim, survivor, decoder = (r["slot"] for r in group.ready)
    proc = group.procs[0]
    budget = watcher(daemon)
    fd = budget_fd(daemon)
    view = budget_file.BudgetView(fd)
    group.go()

    def frozen_holding() -> bool:  # stop it where its crew holds the one prefill token, then look
        if view.slot(victim)["held"] <= 0:
            return False
        proc.send_signal(signal.SIGSTOP)
        if view.slot(victim)["held"] > 0:
            return True
        proc.send_signal(signal.SIGCONT)
        return False
    wait_for(frozen_holding, "the big rank stopped while holding a token", 60)
    # Frozen, it holds its token; the other is kept for decode, so the decoding rank keeps gathering.
    rows = view.slot(decoder)["rows"]
    wait_for(lambda: view.slot(decoder)["rows"] >= rows + 20 * 6144, "decode rows beside a frozen prefill holder", 60)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    wait_for(lambda: view.slot(victim)["held"] == 0 and budget.group_state()["sweeps"] >= 1,
             "the dead rank's slot swept", 30)
    rows = view.slot(survivor)["rows"]
    wait_for(lambda: view.slot(survivor)["rows"] >= rows + 4 * 65536, "the surviving prefill's rows", 120)
    group.stop([1, 2])
    prefill, decode = group.results([1, 2])
    assert decode["stats"]["overdraft"] == 0, decode  # its token was always there
    wait_for(lambda: budget.group_state()["locked"] == 0, "every token given back", 30)
    view.close()
    os.close(fd)


def test_decode_cpus_are_checked_before_anything_starts(socket_dir, shm_dir):
    for args, words in ((["--gather-cpus", "0-1", "--decode-cpus", "2"], "at least one must be left"),
                        (["--gather-cpus", "0-1", "--decode-cpus", "1", "--prefill-gathers", "idle"],
                         "give one of them"),
                        (["--gather-cpus", "off", "--decode-cpus", "1"], "--gather-cpus off has none"),
                        (["--decode-cpus", "many"], "'auto' or a number")):
        done = subprocess.run([sys.executable, "-m", "engramd", "serve", "--socket",
                               f"ipc://{socket_dir}/d.sock", "--shm-dir", str(shm_dir), *args],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and words in done.stderr, (args, done.stderr[-800:])


def test_decode_spares_off_keeps_the_decode_cpus_to_decode_calls_alone(budget_daemon, ranks):
    daemon = budget_daemon("0-1", "--decode-cpus", "1", "--decode-spares", "off")
    assert daemon.status()["gather_budget"]["decode_spares"] == "off"
    text = subprocess.run([sys.executable, "-m", "engramd", "status", "--socket", daemon.endpoint],
                          capture_output=True, text=True, timeout=30).stdout
    assert "decode CPUs 1 (no prefill gather of normal priority there, 1 tokens kept for decode-size calls, no " \
        "spares)" in text, text
    group = ranks(daemon.endpoint, [(65536, 4, 0)])
    (ready,) = group.ready
    assert "kept off the decode CPUs 1, with no spares there (--decode-spares off)" in ready["words"], ready
    assert crew_threads(ready["pid"]) == {"engram-prefill": {(os.SCHED_OTHER, frozenset({0}))}, "engram-spare": set()}
    group.go()
    group.results()  # every row exact on the crew alone
    assert watcher(daemon).group_state()["peak"] == 1


def test_a_rank_decoding_back_to_back_cannot_hold_a_prefill_off_for_good(budget_daemon, ranks):
    """A peer that only ever asks with decode-size calls goes first every time, and the decode token
    is always there for it; the prefill beside it still gets its calls done (on the tokens the
    decoder leaves, or, held off 1 s, without one: counted), every row exact."""
    daemon = budget_daemon("0-1", "--decode-cpus", "1")
    group = ranks(daemon.endpoint, [(65536, 4, 0), (6144, 0, 0)])
    group.go()
    (prefill,) = group.results([0])
    group.stop([1])
    (decode,) = group.results([1])
    assert prefill["calls"] == 4 and decode["calls"] > 0 and decode["stats"]["overdraft"] == 0, (prefill, decode)
