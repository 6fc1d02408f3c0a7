"""A load's progress where the operator looks: log lines off a terminal, a clean bar on one.

Terminals are real pseudo-terminals (pty); loads are slowed with --max-load-rate so
that they last a few seconds.
"""
from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

SLOW_RATE_MB_S = "3"  # the 30 MiB demo table then loads in about 5 s (chunk starts are spaced)
READ_TIMEOUT_S = 60.0


def run_on_terminal(args: list[str], until: str | None = None) -> tuple[subprocess.Popen, str]:
    """Run ``args`` with a pty as stdin, stdout and stderr; read until ``until`` appears or the process ends."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + READ_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if until is not None and until in b"".join(chunks).decode(errors="replace"):
                break
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        else:
            raise AssertionError(f"no {until!r} within {READ_TIMEOUT_S} s:\n{b''.join(chunks).decode()}")
    finally:
        os.close(master)
    return proc, b"".join(chunks).decode(errors="replace")


def serve_args(socket_dir: str, shm_dir: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "engramd", "serve", "--socket", f"ipc://{socket_dir}/engramd.sock",
            "--shm-dir", shm_dir, "--max-load-rate", SLOW_RATE_MB_S, *extra]


def test_off_a_terminal_a_long_load_logs_its_progress(daemon_factory):
    daemon = daemon_factory("--max-load-rate", SLOW_RATE_MB_S)
    daemon.wait_state("ready")
    lines = re.findall(r"generation 1: ([0-9.]+)/([0-9.]+) MiB loaded \((\d+)%\), ([0-9.]+) MB/s, about (\d+) s left",
                       daemon.log())
    assert lines, daemon.log()
    done, total, percent, rate, _left = lines[0]
    assert 0 < float(done) < float(total) and 0 < int(percent) < 100 and float(rate) > 0
    log = daemon.log()
    assert log.index("loading generation 1") < log.index("generation 1: ") < log.index("generation 1 ready")


def test_on_a_terminal_the_bar_ends_at_100_percent_on_its_own_line(socket_dir, shm_dir):
    proc, out = run_on_terminal(serve_args(socket_dir, shm_dir), until="state -> ready")
    try:
        bar_then_log = re.search(r"\r(loading \[#{30}\] 100\.0% ([0-9.]+)/\2 MiB)\r?\n"
                                 r"[0-9-]+ [0-9:,]+ INFO engramd: generation 1 ready", out)
        assert bar_then_log, repr(out[-2000:])
        assert "loading [" not in out[out.index("generation 1 ready"):], "no bar glued to a later line"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_status_wait_on_a_terminal_shows_the_load(daemon_factory, socket_dir):
    daemon = daemon_factory("--max-load-rate", SLOW_RATE_MB_S)
    proc, out = run_on_terminal([sys.executable, "-m", "engramd", "status", "--socket", daemon.endpoint,
                                 "--wait", "60"])
    assert proc.wait(timeout=30) == 0, out
    assert re.search(r"generation 1: loading \[[#.]{30}\] +[0-9.]+% [0-9.]+/[0-9.]+ MiB", out), out
    assert re.search(r"^state\s+ready\r?$", out, re.M), out
