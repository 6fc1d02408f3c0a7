"""Rank processes of tests/support/ranks/budget_rank.py for the gather-budget tests (CPU and GPU): start them,
let them go together, collect and check their results; every wait bounded."""
from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys

from engram_client.core import budget_file

RANK = os.path.join(os.path.dirname(__file__), "budget_rank.py")


def read_line(proc: subprocess.Popen, timeout: float, what: str) -> dict:
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            raise AssertionError(f"no {what} from rank pid {proc.pid} within {timeout} s")
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"rank pid {proc.pid} exited (rc {proc.poll()}) before its {what}")
    return json.loads(line)


class Ranks:
    """Rank processes (tests/support/ranks/budget_rank.py), started together once each has attached."""

    def __init__(self, endpoint: str, specs: list[tuple], device: str = "cpu"):
        # specs: (rows per call, calls (0: until stopped), gather_threads (0: the budget decides)[, decode_priority
        # ("normal" if not given)]) per rank
        self.procs = [subprocess.Popen([sys.executable, RANK, endpoint, str(rows), str(calls), str(threads), str(i),
                                        device, *priority],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                      for i, (rows, calls, threads, *priority) in enumerate(specs)]
        self.ready = [read_line(p, 60, "attach line") for p in self.procs]

    def go(self) -> None:
        for proc in self.procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()

    def stop(self, indices=None) -> None:
        for i in indices if indices is not None else range(len(self.procs)):
            if self.procs[i].poll() is None:
                self.procs[i].stdin.write("stop\n")
                self.procs[i].stdin.flush()

    def results(self, indices=None, timeout: float = 180) -> list[dict]:
        out = []
        for i in indices if indices is not None else range(len(self.procs)):
            result = read_line(self.procs[i], timeout, "result line")
            self.procs[i].wait(timeout=30)
            assert result["errors"] == [] and result["mismatch"] == 0 and result["exact"] == result["calls"] > 0, result
            out.append(result)
        return out

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


def budget_fd(daemon) -> int:
    """A descriptor of the daemon's budget, received as a rank receives it."""
    return budget_file.receive(daemon.status()["gather_budget"]["socket"], 5.0)


def watcher(daemon):
    """A seat of the test process's own on the daemon's budget: it never wants a token, it only looks."""
    from engram_client.lookup.host import _host_gather

    tokens = daemon.status()["gather_budget"]["groups"][0]["tokens"]
    fd = budget_fd(daemon)
    try:
        return _host_gather.NodeBudget(fd, 0, tokens, budget_file.MAX_SLOTS)
    finally:
        os.close(fd)
