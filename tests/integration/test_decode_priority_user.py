"""Decode workers at SCHED_FIFO as a real second user: without a real-time priority limit the pool
is refused at attach with ConfigError saying why and how to allow it, and a pool moved onto a budget
with decode CPUs keeps its workers at normal priority and says so;
given a real-time priority limit of 1 (prlimit, before the user's process starts; skipped where root
here may not raise it) or CAP_SYS_NICE as an ambient capability, its workers run at SCHED_FIFO 1.
A real budget memfd and pool in a subprocess of that user (tests/support/other_user.py)."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys

import pytest

from other_user import other_user  # noqa: F401  (fixture)

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to keep one for decode")

# As the other user: a pool asked for SCHED_FIFO 1 on a budget with a decode CPU, and the seat's words.
AS_USER = r"""
import json, os, sys
from engram_client.core import budget_file
from engram_client.core.errors import ConfigError
from engram_client.lookup.host import _host_gather
from engram_client.lookup.host.gather_seat import GatherSeat


def budget(decode):
    fd = budget_file.create([2], decode=[decode])
    return _host_gather.NodeBudget(fd, 0, 2, budget_file.MAX_SLOTS)


def workers():
    return [os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")
            if open(f"/proc/self/task/{t}/comm").read().strip() == "engram-gather"]


group = {"group": 0, "tokens": 2, "cpus": [0, 1]}
out = {}
seat = GatherSeat(2, "gathers on the node's budget", budget(1), group, [0, 1])
try:  # what EngramClient(decode_priority="fifo") does at attach
    pool = seat.open_pool(signalled=True, realtime=True)
    out.update(priority=pool.decode_priority, policies=workers(), words=seat.explanation, refused=None)
    pool.close()
except ConfigError as exc:
    out.update(refused=f"ConfigError: {exc}", policies=workers())
# A pool asked for it on a budget without decode CPUs, moved to one with them (a new daemon's).
moved = GatherSeat(2, "gathers on the node's budget", budget(0), group, [0, 1])
pool = moved.open_pool(signalled=True, realtime=True)
out["before_move"] = [pool.decode_priority, moved.explanation]
moved.budget = budget(1)
pool.set_budget(moved.budget)
moved._say_prefill_crew()  # as move_seat does
out["after_move"] = [pool.decode_priority, workers(), moved.explanation]
pool.set_budget(budget(0))  # and on to one without decode CPUs again: nothing asked, no refusal left to report
out["moved_back"] = pool.decode_priority
pool.close()
print(json.dumps(out))
"""


def run_as(user, limit: str = "", capability: str = "") -> dict:
    """AS_USER as ``user``, with a real-time priority ``limit`` set by prlimit (root) before setpriv
    execs (skipped where root here may not raise the hard limit), or an ambient ``capability``."""
    argv = user.command(sys.executable, "-c", AS_USER)
    if capability:  # as systemd's AmbientCapabilities= or a pod's capabilities.add give it
        argv[1:1] = [f"--inh-caps=+{capability}", f"--ambient-caps=+{capability}"]
    if limit:
        if shutil.which("prlimit") is None:
            pytest.skip("prlimit (util-linux) is not installed")
        argv = ["prlimit", f"--rtprio={limit}", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/")
    if limit and "failed to set the RTPRIO resource limit" in done.stderr:
        pytest.skip(f"root here may not raise the real-time priority limit: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_another_user_without_a_real_time_limit_is_refused_and_told_how_to_allow_it(other_user):
    result = run_as(other_user)
    # At attach: ConfigError naming the refusal and the ways to allow it, and no worker left running.
    assert result["refused"].startswith("ConfigError: decode_priority='fifo': this process may not run threads at "
                                        "SCHED_FIFO (Operation not permitted)"), result
    assert "LimitRTPRIO=1" in result["refused"] and "leave decode_priority at 'normal'" in result["refused"], result
    assert result["policies"] == [], result
    # Without decode CPUs the workers take prefill, so nothing is asked of the kernel; moved to a budget
    # with them, the refusal is said (the pool keeps serving at normal priority).
    (priority, words) = result["before_move"]
    assert priority == [0, 0] and "they may take prefill-size calls on this budget" in words, result
    (priority, policies, words) = result["after_move"]
    assert priority == [0, errno.EPERM] and set(policies) == {os.SCHED_OTHER}, result
    assert "may not run threads at SCHED_FIFO (Operation not permitted)" in words, result
    assert result["moved_back"] == [0, 0], result


@pytest.mark.parametrize("grant", [{"limit": "1:1"}, {"capability": "sys_nice"}], ids=["rtprio-limit", "cap-sys-nice"])
def test_another_user_allowed_sched_fifo_runs_its_workers_there(other_user, grant):
    result = run_as(other_user, **grant)
    assert result["priority"] == [1, 0] and set(result["policies"]) == {os.SCHED_FIFO}, result
    assert "gather decode-size calls at SCHED_FIFO 1 (decode_priority='fifo')" in result["words"], result
    assert result["refused"] is None, result
    (priority, policies, words) = result["after_move"]  # moved onto decode CPUs: to SCHED_FIFO then
    assert priority == [1, 0] and set(policies) == {os.SCHED_FIFO}, result
