"""systemd's watchdog: the server loop keeps saying it turns, over a real NOTIFY_SOCKET."""
from __future__ import annotations

import os
import socket
import subprocess
import time

from engram_client.tools.serve_process import launch_serve


def test_watchdog_pings_arrive_while_the_loop_turns(socket_dir, shm_dir):
    notify_path = os.path.join(socket_dir, "notify")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(notify_path)
    listener.settimeout(30)
    proc = launch_serve(f"ipc://{socket_dir}/e.sock", shm_dir, output=subprocess.DEVNULL,
                        env=dict(os.environ, NOTIFY_SOCKET=notify_path, WATCHDOG_USEC="400000"))
    try:
        pings, started = [], time.monotonic()
        while len(pings) < 3:
            if "WATCHDOG=1" in listener.recv(4096).decode():
                pings.append(time.monotonic())
        assert pings[-1] - started < 30
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        listener.close()

