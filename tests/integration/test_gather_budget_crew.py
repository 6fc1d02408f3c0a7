"""The gather budget's prefill crew (--prefill-gathers idle) with real rank processes against a real
daemon: each rank's crew at SCHED_IDLE and what status says of it, a rank that moves to a daemon
asking for one, and a decode-size call that does not wait on a crew thread kept off its CPU.  Read
from the kernel's thread table, the budget's counters and its grant log: no timing asserts."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from budget_ranks import watcher
from waiting import end_process, wait_for

STAND_IN = 3  # a grant log entry's `how` for a stand-in (engine/budget.h)


def crew_policies(pid: int) -> list[int]:
    """The scheduling policy of each prefill-crew thread (named engram-prefill) of process ``pid``."""
    policies = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/comm") as f:
            if f.read().strip() == "engram-prefill":
                policies.append(os.sched_getscheduler(int(task)))
    return policies


def test_prefill_gathers_idle_gives_every_rank_a_crew_at_sched_idle_and_status_says_so(budget_daemon, ranks):
    daemon = budget_daemon("0-1", "--prefill-gathers", "idle")
    assert daemon.status()["gather_budget"]["prefill_gathers"] == "idle"
    group = ranks(daemon.endpoint, [(65536, 4, 0), (6144, 30, 0)])
    for ready in group.ready:
        assert "gathered by 2 threads at SCHED_IDLE" in ready["words"], ready["words"]
        assert crew_policies(ready["pid"]) == [os.SCHED_IDLE] * 2
    group.go()

    def reported():
        clients = daemon.status()["clients"]
        return len(clients) == 2 and all((c.get("budget") or {}).get("prefill_threads") == 2 for c in clients)
    wait_for(reported, "both clients' prefill threads in status", 30)
    text = subprocess.run([sys.executable, "-m", "engramd", "status", "--socket", daemon.endpoint],
                          capture_output=True, text=True, timeout=30).stdout
    assert "prefill-size calls gathered at SCHED_IDLE" in text and "2 prefill threads at SCHED_IDLE" in text, text
    group.results()  # every row of both ranks exact


def test_a_rank_moved_to_a_daemon_that_asks_for_a_crew_starts_one(budget_daemon, ranks):
    first = budget_daemon("0")
    group = ranks(first.endpoint, [(8192, 0, 2)])
    pid = group.ready[0]["pid"]
    assert crew_policies(pid) == [] and "SCHED_IDLE" not in group.ready[0]["words"]
    group.go()
    first.kill(signal.SIGKILL)
    second = budget_daemon("0", "--prefill-gathers", "idle")
    wait_for(lambda: crew_policies(pid) == [os.SCHED_IDLE] * 2, "the rank's crew after its move", 30)
    wait_for(lambda: ((second.status()["clients"] or [{}])[0].get("budget") or {}).get("prefill_threads") == 2,
             "its prefill threads in the new daemon's status", 30)
    group.stop()
    group.results()  # every row exact, before and after the move


def cpu_hog(cpu: int) -> subprocess.Popen:
    """A process of normal priority that keeps ``cpu`` busy: the CPU a crew thread is pinned to."""
    return subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])


def test_a_decode_call_stands_in_for_a_crew_thread_kept_off_its_cpu(budget_daemon, ranks):
    # One token, on CPU 0; a rank prefilling without pause (its crew at SCHED_IDLE, pinned to CPU 0)
    # and a rank decoding, while a busy process of normal priority holds CPU 0.  A crew thread with
    # the token then gets almost no CPU time: before stand-ins, the decoding rank waited 1 s for the
    # token and then gathered without one (an overdraft) in every run.
    daemon = budget_daemon("0", "--prefill-gathers", "idle")
    group = ranks(daemon.endpoint, [(1 << 20, 0, 1), (8192, 0, 1)])
    budget = watcher(daemon)
    hog = cpu_hog(0)
    try:
        group.go()

        def reported() -> bool:  # the count travels: C counter, heartbeat (a 1.6 field), status
            return any((c.get("budget") or {}).get("stand_ins", 0) >= 1 for c in daemon.status()["clients"])
        wait_for(reported, "the decoding rank's stand-ins in status", 60)
        text = subprocess.run([sys.executable, "-m", "engramd", "status", "--socket", daemon.endpoint],
                              capture_output=True, text=True, timeout=30).stdout
        assert "stand-ins for prefill threads off their CPU" in text, text
        group.stop([1])
        (decode,) = group.results([1])  # every row exact
    finally:
        end_process(hog)
    group.stop([0])
    (prefill,) = group.results([0])
    assert decode["stats"]["overdraft"] == 0, decode  # never held off for the 1 s an overdraft needs
    assert decode["stats"]["stand_ins"] >= 1, decode  # it gathered in the stalled crew thread's place
    stood_in = [entry for entry in budget.grant_log() if entry[4] == STAND_IN]  # the last 1,024 grants
    assert all(entry[1] == group.ready[1]["slot"] for entry in stood_in), stood_in[:3]  # the waiter's, only
    assert budget.group_state()["peak"] <= 1  # a stand-in is not a token: the count of gathering threads holds
