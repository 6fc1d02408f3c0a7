"""The node's gather budget against a hostile member of the daemon's group, with real rank processes
and a raw attacker process holding the budget as a rank holds it: a decision lock word that never
keeps one value, the slots' lock bytes all taken, a header written over, the memory's mode taken
away by a process of the daemon's user, and connections to the ``.budget`` socket held unread.
Every rank must still attach and look up exactly while the attack lasts (each attacker runs until
the test ends it), on a seat or, where none can be had, beside the budget saying so; no timing
asserts."""
from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import tempfile

from budget_ranks import RANK, budget_fd, read_line
from engram_client.core import budget_file
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


@contextlib.contextmanager
def unprivileged_daemon(user, shm_dir: str, *extra: str, groups: tuple[int, ...] = (), nofile: int | None = None):
    """``engramd serve`` as ``user`` (supplementary ``groups``, RLIMIT_NOFILE ``nofile``) on the demo
    table with a one-CPU budget, in a socket directory its group may enter; yields (its socket
    directory, its endpoint, its log, the processes to end afterwards) once the budget's socket is there."""
    base = tempfile.mkdtemp(prefix="engt-h-")
    os.chmod(base, 0o755)
    os.chown(base, user.uid, user.gid)
    os.chown(shm_dir, user.uid, user.gid)
    endpoint, log_path = f"ipc://{base}/engramd.sock", os.path.join(base, "engramd.log")
    limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) if nofile else None
    processes = []
    try:
        with open(log_path, "ab") as log:
            processes.append(subprocess.Popen(
                ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}",
                 f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups",
                 *serve_command(endpoint, shm_dir, "--gather-cpus", "0", *extra, log_level="info")],
                stdout=log, stderr=subprocess.STDOUT, cwd="/", preexec_fn=limit))
        wait_for(lambda: os.path.exists(f"{base}/engramd.sock.budget"), "the daemon's budget socket", 60)
        yield base, endpoint, log_path, processes
    finally:
        for process in processes:
            end_process(process, grace=5)
        shutil.rmtree(base, ignore_errors=True)


def rank_as(user, endpoint: str, processes: list) -> dict:
    """A rank process (tests/support/ranks/budget_rank.py, 3 calls of 8,192 rows, 2 threads) of ``user``: its attach line."""
    processes.append(user.spawn(sys.executable, RANK, endpoint, "8192", "3", "2", "0", "cpu", stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, cwd="/"))
    return read_line(processes[-1], 90, "attach line")


def rank_results(rank: subprocess.Popen) -> dict:
    rank.stdin.write("go\n")
    rank.stdin.flush()
    result = read_line(rank, 120, "result line")
    assert result["errors"] == [] and result["exact"] == result["calls"] == 3, result
    return result


def test_connections_held_unread_on_the_budget_socket_keep_no_rank_off_it(shm_dir, daemon_user, other_user):
    # The daemon unprivileged, other_user's group as its --group: other_user may connect, as a member of it.
    with unprivileged_daemon(daemon_user, shm_dir, "--group", other_user.name, groups=(other_user.gid,),
                             nofile=DAEMON_NOFILE) as (base, endpoint, log_path, processes):
        holder = other_user.spawn_python(HOLDER, f"{base}/engramd.sock.budget", str(DAEMON_NOFILE + 100), "600")
        processes.append(holder)
        assert holder.stdout.readline().strip() == f"holding {DAEMON_NOFILE + 100}", holder.stderr.read()
        attached = rank_as(daemon_user, endpoint, processes)
        assert attached["slot"] is not None, attached["words"]  # its seat, while the connections are held
        rank_results(processes[-1])
        assert holder.poll() is None, "the holder left before the rank was served: nothing was shown"
        with open(log_path, errors="replace") as f:
            assert f"refused the gather budget to a peer of uid {other_user.uid}" in f.read()


def test_a_peer_that_writes_over_the_header_keeps_no_rank_off_its_seat(budget_daemon, ranks):
    daemon = budget_daemon("0-1")
    fd = budget_fd(daemon)  # as a member of the daemon's group has it
    try:
        os.pwrite(fd, (0).to_bytes(4, "little"), 16)  # the header's groups = 0
        group = ranks(daemon.endpoint, [(16384, 3, 2)])
        assert group.ready[0]["slot"] is not None, group.ready[0]["words"]  # seated on what the daemon announced
        group.go()
        group.results()
    finally:
        os.close(fd)


def test_a_rank_kept_off_every_slot_gathers_beside_the_budget_on_one_slots_share_and_says_so(budget_daemon, ranks):
    daemon = budget_daemon("0-1")
    fd = budget_fd(daemon)
    try:  # one lock over every slot's liveness byte, outside the protocol
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, budget_file.SLOT_LOCKS,
                                                        budget_file.MAX_SLOTS, 0))
        group = ranks(daemon.endpoint, [(16384, 3, 0)])  # gather_threads left to the budget
        ready = group.ready[0]
        assert ready["slot"] is None and ready["threads"] == 1, ready  # 2 tokens over 64 slots: one thread
        assert "no seat on the node's gather budget (every one of the budget's 64 slots is locked" in ready["words"]
        client = wait_for(lambda: (daemon.status()["clients"] or [{}])[0].get("budget") and daemon.status()["clients"][0],
                          "the seatless rank's heartbeat", 30)
        assert "slot" not in client["budget"] and client["budget"]["threads"] == 1, client
        text = subprocess.run([sys.executable, "-m", "engramd", "status", "--socket", daemon.endpoint],
                              capture_output=True, text=True, timeout=60).stdout
        assert "gather budget: no seat" in text and "1 thread of its own beside it on CPUs 0-1" in text, text
        group.go()
        group.results()
    finally:
        os.close(fd)


# A process of the daemon's own user taking read and write from the budget's memory.
UNMODE = r"""
import os, sys
from engram_client.core import budget_file
fd = budget_file.receive(sys.argv[1], 5.0)
os.fchmod(fd, 0)
print("mode", oct(os.fstat(fd).st_mode & 0o777), flush=True)
"""


def test_a_budget_made_unreadable_by_the_daemons_user_is_put_back_or_refused_in_words(shm_dir, daemon_user):
    with unprivileged_daemon(daemon_user, shm_dir) as (base, endpoint, log_path, processes):
        socket_path = f"{base}/engramd.sock.budget"
        done = subprocess.run(daemon_user.command(sys.executable, "-c", UNMODE, socket_path), capture_output=True,
                              text=True, timeout=60)
        assert done.stdout.strip() == "mode 0o0", done.stderr
        attached = rank_as(daemon_user, endpoint, processes)  # not root: the mode binds it
        assert attached.get("slot") is not None, attached  # the daemon put the mode back before handing it over
        rank_results(processes[-1])
        with open(log_path, errors="replace") as f:
            assert "the gather budget's memory had mode 0, not" in f.read()
    # Where the change lands between the daemon's look and the rank's open: an EngramError naming it.
    fd = budget_file.create([1])
    with tempfile.TemporaryDirectory(prefix="engt-m-") as where, socket.socket(socket.AF_UNIX) as listener:
        os.chmod(where, 0o755)
        listener.bind(f"{where}/b.sock")
        os.chmod(f"{where}/b.sock", 0o777)
        listener.listen(1)
        os.fchmod(fd, 0)
        receiver = subprocess.Popen(daemon_user.command(sys.executable, "-c", RECEIVE, f"{where}/b.sock"),
                                    stdout=subprocess.PIPE, text=True)
        listener.settimeout(30)
        conn, _ = listener.accept()
        with conn:
            socket.send_fds(conn, [b"B"], [fd])
            said = receiver.communicate(timeout=60)[0]
    os.close(fd)
    assert said.startswith("DaemonUnavailableError: cannot take the gather budget") and "mode 0," in said, said


RECEIVE = r"""
import sys
from engram_client.core import budget_file
try:
    budget_file.receive(sys.argv[1], 5.0)
    print("received")
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
"""
