"""A synchronous gather's job lives on its caller's stack: no worker may touch it once the caller returns.

pool.gather (a CPU client's lookups, the hot-row list's load at attach) keeps its job on the
calling thread's stack.  A worker used to read the job's signal pointer just after its last
decrement of the job's users, when the caller may already have returned and reused that stack:
several rank processes gathering on one node budget while the cores were oversubscribed
crashed on the stale pointer (found by benchmarks/node/ranks.py --stage host on the 16-core GPU machine).
Here several real processes share one real sealed budget memfd (each its own open file
description, as ranks have), each with more workers than the machine has cores and three threads
gathering small calls back to back, with other C calls reusing the stack in between.  The test
hook set_leave_pause makes every worker pause 0.2 ms right after it leaves a job, so callers have
returned by then: the old read after the decrement crashed (SIGSEGV) in every run tried with it,
about one process in thirty without it.  Every row is checked and every process must exit cleanly.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from engram_client.core import budget_file

PROCESSES, SECONDS, LEAVE_PAUSE_NS = 4, 3.0, 200_000

CHILD = textwrap.dedent("""
    import json, sys, threading, time
    import numpy as np
    from engram_client.lookup.host import _host_gather

    import os
    inherited, tokens, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    fd = os.open(f"/proc/self/fd/{inherited}", os.O_RDWR)  # its own open file description, as a rank's
    rows, row_bytes = 4096, 264
    table = np.random.default_rng(0).integers(0, 256, (rows, row_bytes), dtype=np.uint8)
    budget = _host_gather.NodeBudget(fd, 0, tokens, 64)
    _host_gather.set_leave_pause(int(sys.argv[4]))  # widen the moment after a worker leaves a job
    pool = _host_gather.GatherPool(8, caller_gathers=False, budget=budget)
    noise = {"a": [list(range(20)) for _ in range(5)], "b": {"c": [1.5, "x" * 40]}}
    calls, wrong = [], []

    def gather_loop(seed):
        rng = np.random.default_rng(seed)
        counter = np.zeros(1, dtype=np.int64)
        end, done = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            n = int(rng.integers(33, 400))  # 2 to 13 blocks: the workers join and leave every call
            ids = rng.integers(0, rows, n).astype(np.int64)
            out = np.empty((n, row_bytes), dtype=np.uint8)
            pool.gather(table.ctypes.data, 0, rows, row_bytes, ids.ctypes.data, True, n, out.ctypes.data,
                        counter.ctypes.data)
            if not np.array_equal(out, table[ids]):
                wrong.append(n)
            json.loads(json.dumps(noise))  # other C calls reuse the stack the job was on
            done += 1
        calls.append(done)

    threads = [threading.Thread(target=gather_loop, args=(seed,)) for seed in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    pool.close()
    print("calls", sum(calls), "wrong", len(wrong))
""")


def test_rank_processes_gathering_synchronously_on_one_budget_never_touch_a_returned_job():
    fd = budget_file.create([2])
    try:
        procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(fd), "2", str(SECONDS), str(LEAVE_PAUSE_NS)], pass_fds=(fd,),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(PROCESSES)]
        results = [proc.communicate(timeout=120) + (proc.returncode,) for proc in procs]
    finally:
        os.close(fd)
    for out, err, code in results:
        assert code == 0, f"a rank process ended with {code}: {out}{err}"
        words = out.split()
        assert words[0] == "calls" and int(words[1]) > 0 and words[3] == "0", out
