"""The node's gather budget against a hostile member of the daemon's group, with real rank processes
and a raw attacker process holding the budget as a rank holds it: a decision lock word that never
keeps one value, the slots' lock bytes all taken, a header written over, and connections to the
``.budget`` socket held unread.  Every rank must still attach and look up exactly while the attack
lasts (each attacker runs until the test ends it); no timing asserts."""
from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile

from budget_ranks import RANK, read_line
from engram_client.tools.serve_process import serve_command
from other_user import daemon_user, other_user  # noqa: F401  (fixtures)
from waiting import end_process, wait_for

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


# Connections to the daemon's .budget socket, held and never read (standard library only: it runs
# as another user on the system's Python).
HOLDER = r"""
import resource, socket, sys, time
path, count = sys.argv[1], int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
held = []
for _ in range(count):
    held.append(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    held[-1].connect(path)
print("holding", len(held), flush=True)
time.sleep(float(sys.argv[3]))
"""
DAEMON_NOFILE = 256  # the kernel passes no more descriptors than this for a user who has as many unread


def test_connections_held_unread_on_the_budget_socket_keep_no_rank_off_it(shm_dir, daemon_user, other_user):
    base = tempfile.mkdtemp(prefix="engt-h-")
    os.chmod(base, 0o755)  # the daemon's user's socket directory, which its group may enter
    os.chown(base, daemon_user.uid, daemon_user.gid)
    os.chown(shm_dir, daemon_user.uid, daemon_user.gid)
    endpoint, log_path = f"ipc://{base}/engramd.sock", os.path.join(base, "engramd.log")
    processes = []
    try:
        with open(log_path, "ab") as log:  # unprivileged, with other_user's group as the daemon's --group
            processes.append(subprocess.Popen(
                ["setpriv", f"--reuid={daemon_user.uid}", f"--regid={daemon_user.gid}", f"--groups={other_user.gid}",
                 *serve_command(endpoint, shm_dir, "--group", other_user.name, "--gather-cpus", "0",
                                log_level="info")],
                stdout=log, stderr=subprocess.STDOUT, cwd="/",
                preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (DAEMON_NOFILE, DAEMON_NOFILE))))
        wait_for(lambda: os.path.exists(f"{base}/engramd.sock.budget"), "the daemon's budget socket", 60)
        holder = other_user.spawn_python(HOLDER, f"{base}/engramd.sock.budget", str(DAEMON_NOFILE + 100), "600")
        processes.append(holder)
        assert holder.stdout.readline().strip() == f"holding {DAEMON_NOFILE + 100}", holder.stderr.read()
        rank = daemon_user.spawn(sys.executable, RANK, endpoint, "8192", "3", "2", "0", "cpu", stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, cwd="/")
        processes.append(rank)
        attached = read_line(rank, 90, "attach line")
        assert attached["slot"] is not None, attached["words"]  # its seat, while the connections are held
        rank.stdin.write("go\n")
        rank.stdin.flush()
        result = read_line(rank, 120, "result line")
        assert result["errors"] == [] and result["exact"] == result["calls"] == 3, result
        assert holder.poll() is None, "the holder left before the rank was served: nothing was shown"
        with open(log_path, errors="replace") as f:
            assert f"refused the gather budget to a peer of uid {other_user.uid}" in f.read()
    finally:
        for process in processes:
            end_process(process, grace=5)
        shutil.rmtree(base, ignore_errors=True)
