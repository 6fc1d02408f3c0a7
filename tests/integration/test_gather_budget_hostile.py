"""The node's gather budget against a hostile member of the daemon's group, with real rank processes
and a raw attacker process holding the budget as a rank holds it: a decision lock word that never
keeps one value, the slots' lock bytes all taken, a header written over, and connections to the
``.budget`` socket held unread.  Every rank must still attach and look up exactly while the attack
lasts (each attacker runs until the test ends it); no timing asserts."""
from __future__ import annotations

import os
import subprocess
import sys

from budget_ranks import read_line

# A peer storing a new non-zero value into group 0's decision-lock word every millisecond, so that
# no value stays there long: a waiter that only took over a value held unchanged waited forever.
# One such process per CPU, each pinned and at a real-time priority: a CPU whose scribbler is off it
# (a busy machine, a VM's stolen time) leaves the value unchanged long enough to be taken over.
SCRIBBLER = r"""
import ctypes, mmap, os, sys, time
from engram_client.core import budget_file
os.sched_setaffinity(0, {int(sys.argv[3])})
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
except OSError:
    os.setpriority(os.PRIO_PROCESS, 0, -20)
view = mmap.mmap(budget_file.receive(sys.argv[1], 5.0), budget_file.FILE_BYTES)
word = ctypes.c_uint64.from_buffer(view, budget_file.GROUPS_AT)  # one 8-byte store (struct zero-fills first)
print("scribbling", flush=True)
deadline, value = time.monotonic() + float(sys.argv[2]), int(sys.argv[3]) << 40
while time.monotonic() < deadline:
    value += 1
    word.value = value << 8 | 63
    time.sleep(0.001)
"""


def attacker(code: str, *args: str) -> subprocess.Popen:
    """A raw attacker process of this test's user (a member of the daemon's group), ready once it says so."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.strip(), f"the attacker exited (rc {proc.wait(timeout=30)}) before it began"
    return proc


def test_a_peer_that_keeps_changing_the_decision_lock_stalls_no_rank(budget_daemon, ranks):
    daemon = budget_daemon("0-1")
    attached = ranks(daemon.endpoint, [(16384, 0, 2)])  # looks up until stopped, all through the attack
    where = daemon.status()["gather_budget"]["socket"]
    scribblers = [attacker(SCRIBBLER, where, "600", str(cpu)) for cpu in sorted(os.sched_getaffinity(0))[:4]]
    try:
        attached.go()
        newcomer = ranks(daemon.endpoint, [(16384, 5, 2)])  # attaches while the word keeps changing
        newcomer.go()
        (late,) = newcomer.results(timeout=120)
        attached.stop()
        (early,) = attached.results(timeout=120)
        assert all(s.poll() is None for s in scribblers), "a scribbler stopped before the ranks were done"
    finally:
        for scribbler in scribblers:
            scribbler.kill()
            scribbler.wait(timeout=30)
    # Each took the lock over (or passed it by) and went on deciding without it, counted where the peer cannot write.
    assert late["stats"]["lock_takeovers"] >= 1 and early["stats"]["lock_takeovers"] >= 1, (late, early)
