"""Decode workers at SCHED_FIFO with real rank processes against a real daemon on this machine's two
CPUs, one kept for decode-size calls (--decode-cpus 1, quiet spares: the daemon's default): a rank
of decode_priority "fifo" runs its workers at SCHED_FIFO 1 and says so, in its words and through its
heartbeats in status; while only such a rank decodes, the group's decode stamp stays unset, status
says the spares are free, and a prefilling rank's spare keeps gathering on the decode CPU without
standing aside; a rank of the default decode_priority, "normal", keeps its workers at normal
priority and its decode calls set the stamp, so the spares stand aside for it.  Every row
checked against the demo table.  Read from the kernel's thread table, the budget's group state and
the daemon's status: no timing asserts.  Needs a process that may run threads at SCHED_FIFO (root
here); tests/integration/test_decode_priority_user.py has the refusal."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from budget_ranks import budget_fd, watcher
from engram_client.core import budget_file
from proc_stats import may_run_fifo, worker_policies
from waiting import wait_for

pytestmark = [pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to keep one for decode"),
              pytest.mark.skipif(not may_run_fifo(), reason="this process may not run threads at SCHED_FIFO")]
DECODE, PREFILL = 6144, 65536


def reported(daemon, slot: int) -> dict:
    """The budget counters of the rank on ``slot``, as its latest heartbeat reported them to the daemon."""
    for client in daemon.status()["clients"]:
        budget = client.get("budget") or {}
        if budget.get("slot") == slot:
            return budget
    return {}


def test_a_fifo_rank_decodes_without_sending_the_spares_aside_and_a_normal_one_still_does(budget_daemon, ranks):
    daemon = budget_daemon("0-1", "--decode-cpus", "1")
    group = ranks(daemon.endpoint, [(DECODE, 0, 0, "fifo"), (PREFILL, 0, 0)])
    decoder, prefill = group.ready
    assert decoder["decode_priority"] == [1, 0], decoder
    assert "its workers gather decode-size calls at SCHED_FIFO 1 (decode_priority='fifo')" in decoder["words"], decoder
    assert worker_policies(decoder["pid"]) == {os.SCHED_FIFO}
    budget = watcher(daemon)
    stamp = budget.group_state()["decode_at"]  # the prefilling rank's first lookup (8 rows, normal priority) set it
    fd = budget_fd(daemon)
    view = budget_file.BudgetView(fd)
    group.go()
    wait_for(lambda: view.slot(decoder["slot"])["rows"] >= 40 * DECODE, "the FIFO rank's decode rows", 120)
    # Count from a heartbeat sent after the decoding began, so that blocks gathered before it are not counted.
    rows = view.slot(prefill["slot"])["rows"]
    wait_for(lambda: reported(daemon, prefill["slot"]).get("rows", 0) >= rows,
             "a heartbeat of the prefilling rank sent while the FIFO rank decodes", 60)
    before = reported(daemon, prefill["slot"])
    wait_for(lambda: reported(daemon, prefill["slot"]).get("spare_blocks", 0) > before.get("spare_blocks", 0),
             "the prefilling rank's spare to gather on the decode CPU while the FIFO rank decodes", 60)
    # ...and it never stood aside meanwhile: no rank it must leave the CPU to has decoded.
    assert reported(daemon, prefill["slot"]).get("spare_asides", 0) == before.get("spare_asides", 0)
    assert budget.group_state()["decode_at"] == stamp  # no decode call of the FIFO rank set the stamp
    assert not daemon.status()["gather_budget"]["groups"][0]["decoding"]
    # Its heartbeats tell the operator (1.10): status and the metrics say it.
    assert reported(daemon, decoder["slot"])["decode_fifo"] == 1
    text = subprocess.run([sys.executable, "-m", "engramd", "status", "--socket", daemon.endpoint],
                          capture_output=True, text=True, timeout=30).stdout
    assert "decode-size calls gathered at SCHED_FIFO 1" in text, text
    # A rank at normal priority decodes: its calls set the stamp, and the spares stand aside.
    normal = ranks(daemon.endpoint, [(DECODE, 0, 0)])
    (ready,) = normal.ready
    assert ready["decode_priority"] == [0, 0] and worker_policies(ready["pid"]) == {os.SCHED_OTHER}, ready
    assert "SCHED_FIFO" not in ready["words"], ready
    stamp = budget.group_state()["decode_at"]  # its first lookup set it already
    normal.go()
    wait_for(lambda: view.slot(ready["slot"])["rows"] >= 10 * DECODE, "the normal rank's decode rows", 120)
    wait_for(lambda: budget.group_state()["decode_at"] != stamp, "the normal rank's decode calls to move the stamp", 60)
    wait_for(lambda: daemon.status()["gather_budget"]["groups"][0]["decoding"], "status to say a rank decodes", 30)
    wait_for(lambda: reported(daemon, ready["slot"]).get("decode_fifo") == 0, "the normal rank's heartbeat", 30)
    normal.stop()
    group.stop()
    normal.results()
    group.results()
    view.close()
    os.close(fd)
