"""A launcher ended by SIGTERM (``timeout``, a job system) stops the daemon it started.

The benchmarks start their daemon with engram_client.tools.bench.start_daemon and stop it in a
``finally``; by default SIGTERM ends a Python process without running it, and the daemon went on
serving, its table in /dev/shm (a 16 GiB one once outlived its launcher on the GPU machine and
left a later test too little of /dev/shm).  start_daemon calls exit_on_sigterm, which makes
SIGTERM raise SystemExit.  Here a real launcher process starts a real daemon on its embedded demo
table, in the test's /dev/shm directory, and is sent SIGTERM; the control, a launcher that does not
call exit_on_sigterm, shows what the default did.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from waiting import end_process, wait_for

LAUNCHER = textwrap.dedent("""
    import sys, time
    from engram_client.attach.connection import DaemonConnection
    from engram_client.attach.readiness import wait_ready
    from engram_client.tools.serve_process import exit_on_sigterm, launch_serve, wait_for_socket
    endpoint, shm_dir, handled = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    if handled:
        assert exit_on_sigterm()
    proc = launch_serve(endpoint, shm_dir)
    try:
        wait_for_socket(proc, endpoint)
        wait_ready(DaemonConnection(endpoint), 120.0, daemon=proc)  # serving its table, as a benchmark's daemon is
        print(proc.pid, flush=True)  # inside the try: the test's SIGTERM may come at once
        time.sleep(120)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
""")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("handled", [True, False], ids=["exit_on_sigterm", "default"])
def test_a_launcher_ended_by_sigterm_stops_its_daemon(socket_dir, shm_dir, handled):
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, endpoint, shm_dir, "1" if handled else "0"],
                                stdout=subprocess.PIPE, text=True)
    daemon_pid = None
    try:
        line = launcher.stdout.readline()  # the launcher's own waits are bounded (120 s each)
        assert line, f"the launcher exited ({launcher.wait(timeout=60)}) before its daemon was ready"
        daemon_pid = int(line)
        assert any(name.endswith(".table") for name in os.listdir(shm_dir)), os.listdir(shm_dir)
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == (128 + signal.SIGTERM if handled else -signal.SIGTERM)
        if handled:
            wait_for(lambda: not alive(daemon_pid), "the daemon to stop with its launcher", 60)
            assert os.listdir(shm_dir) == [], f"the daemon left {os.listdir(shm_dir)} behind"
        else:
            assert alive(daemon_pid), "the default SIGTERM left the daemon serving (the control)"
    finally:
        end_process(launcher)
        if daemon_pid is not None and alive(daemon_pid):
            os.kill(daemon_pid, signal.SIGTERM)
            wait_for(lambda: not alive(daemon_pid), "the control's daemon to stop", 60)
