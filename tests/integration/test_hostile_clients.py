"""Careless clients: handles used after their client is gone, and clients that fork."""
from __future__ import annotations

import subprocess
import sys
import textwrap

STALE = textwrap.dedent("""
    import gc, sys, torch
    from engram_client import EngramClient, NotAttachedError
    endpoint, how = sys.argv[1], sys.argv[2]
    if how == "collected":
        table = EngramClient(endpoint=endpoint, device="cpu", timeout=30).table(1)
        gc.collect()
    elif how == "closed":
        client = EngramClient(endpoint=endpoint, device="cpu", timeout=30)
        table = client.table(1)
        client.close()
    else:
        with EngramClient(endpoint=endpoint, device="cpu", timeout=30) as client:
            table = client.table(1)
    try:
        table.lookup(torch.tensor([1, 2]))
        print("READ")
    except NotAttachedError as exc:
        print("REFUSED", exc)
""")


def test_a_handle_outliving_its_client_raises_instead_of_crashing(demo_daemon):
    # A table keeps its client alive, so one whose client is referenced nowhere else still reads;
    # a closed client's tables refuse.
    for how, expected in (("collected", "READ"), ("closed", "REFUSED"), ("with", "REFUSED")):
        result = subprocess.run([sys.executable, "-c", STALE, demo_daemon.endpoint, how], capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 0, f"{how}: exit {result.returncode}: {result.stderr[-2000:]}"
        assert result.stdout.startswith(expected), (how, result.stdout)


# The parent's bounded wait for its forked child (pid): a child that hangs is killed and reported.
WAIT_CHILD = """
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        print("CHILD HUNG", flush=True)
        sys.exit(1)
"""

FORK = textwrap.dedent("""
    import os, sys, time, torch
    from engram_client import EngramClient, EngramError, NotAttachedError
    from engram_client.core.demo_rows import demo_rows
    client = EngramClient(endpoint=sys.argv[1], device="cpu", timeout=30)
    ids = torch.tensor([0, 5, 77])
    expected = client.table(1).lookup(ids)
    pid = os.fork()
    if pid == 0:
        try:  # the gather threads stayed in the parent: the child must make its own client
            client.table(1).lookup(ids)
            looked = "READ"
        except NotAttachedError as exc:
            looked = "REFUSED" if "forked child" in str(exc) else f"OTHER {exc}"
        try:
            client.status(timeout=2)
            talked = "TALKED"
        except EngramError as exc:
            talked = "REFUSED"
        print("child", looked, talked, flush=True)
        client.close()
        sys.exit(0)  # a normal interpreter exit: finalizers and atexit run
""" + WAIT_CHILD + """
    print("parent", os.waitstatus_to_exitcode(status), client.status()["state"], client.attached,
          torch.equal(client.table(1).lookup(ids), expected), flush=True)
    client.close()
""")


def test_a_forked_child_exits_promptly_and_leaves_the_parent_working(demo_daemon):
    result = subprocess.run([sys.executable, "-c", FORK, demo_daemon.endpoint], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert "child REFUSED REFUSED" in lines, result.stdout
    assert "parent 0 ready True True" in lines, result.stdout
    assert demo_daemon.status()["clients"] == []


# docs/integration.md's pattern for a forked child: a client of its own.  The parent's lookup is
# large enough that torch runs it on its CPU thread pool (two threads, so a pool exists), which
# the child does not inherit; before, the child's first large lookup waited for it forever.
FORK_NEW_CLIENT = textwrap.dedent("""
    import os, sys, time, torch
    from engram_client import EngramClient
    torch.set_num_threads(2)
    client = EngramClient(endpoint=sys.argv[1], device="cpu", timeout=30)
    ids = torch.arange(5000)
    expected = client.table(1).lookup(ids)
    pid = os.fork()
    if pid == 0:
        with EngramClient(endpoint=sys.argv[1], device="cpu", timeout=30) as own:
            print("child", torch.equal(own.table(1).lookup(ids), expected), torch.get_num_threads(), flush=True)
        os._exit(0)
""" + WAIT_CHILD + """
    print("parent", os.waitstatus_to_exitcode(status), torch.equal(client.table(1).lookup(ids), expected),
          torch.get_num_threads(), flush=True)
    client.close()
""")


def test_a_forked_child_with_its_own_client_looks_up_as_the_parent_does(demo_daemon):
    result = subprocess.run([sys.executable, "-c", FORK_NEW_CLIENT, demo_daemon.endpoint], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert result.stdout.splitlines() == ["child True 1", "parent 0 True 2"], result.stdout
    assert "torch's CPU thread pool (OpenMP) does not survive a fork" in result.stderr
    assert "multiprocessing.get_context('spawn')" in result.stderr
