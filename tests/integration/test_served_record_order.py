"""A crash while the served record is being written never leaves clients on a generation a restart drops.

The daemon is traced with strace, which holds its every fsync for a while (a slow disk, or the
moment of a crash), and is killed while one is held, right after a reload: whatever a client
could see just before the crash, the restart serves.  The record's temporary goes at the restart.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess

import pytest

from engramd.synth.writer import write_checkpoint
from waiting import wait_for

HELD_S = 30  # how long strace holds each fsync: far longer than the steps taken meanwhile


def temporaries(shm_dir: str) -> list[str]:
    """The served record's temporaries in the shm dir (a private one: the daemon's files are there)."""
    return sorted(name for name in os.listdir(shm_dir) if ".served.tmp-" in name)


def test_a_crash_inside_the_records_fsync_does_not_roll_clients_back(daemon_factory, tmp_path):
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    a, b = (str(tmp_path / "ckpts" / name) for name in "ab")
    write_checkpoint(a, vocab_size=300, head_dim=128, seed=1)
    write_checkpoint(b, vocab_size=300, head_dim=128, seed=2)
    daemon = daemon_factory("--checkpoint", a)
    daemon.wait_state("ready")
    tracer = subprocess.Popen(["strace", "-f", "-o", os.devnull, "-e", "trace=fsync", "-e",
                               f"inject=fsync:delay_enter={HELD_S}s", "-p", str(daemon.proc.pid)],
                              stderr=subprocess.PIPE, text=True)
    try:
        line = tracer.stderr.readline()
        if "attached" not in line:
            pytest.skip(f"cannot trace the daemon here: {line.strip()}")
        daemon.connection.request("reload", {"checkpoint": b})
        wait_for(lambda: temporaries(daemon.shm_dir), "the served record's temporary to appear", 60)
        seen = daemon.status()  # what any client could see while the record is not yet in place
        # A traced daemon dies only once strace lets go of it, so strace goes right after the SIGKILL:
        # the kernel skips a syscall whose tracee has a SIGKILL pending, and the held fsync never runs.
        daemon.proc.send_signal(signal.SIGKILL)
    finally:
        tracer.kill()
        tracer.wait(timeout=30)
    daemon.proc.wait(timeout=30)
    assert temporaries(daemon.shm_dir), "the crash left no temporary: nothing here was tested"

    again = daemon_factory("--checkpoint", a)
    status = again.wait_state("ready")
    assert status["checkpoint"] == seen["checkpoint"] and status["generation"] >= seen["generation"], (seen, status)
    assert temporaries(again.shm_dir) == [], "the dead daemon's temporary was left behind"
