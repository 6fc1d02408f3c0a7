"""What peers can make the daemon print: control characters in status and the log, and a
log flooded by refused requests.  A real daemon, its real log file, the real CLI.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import zmq

from engram_client.core import protocol
from waiting import wait_for

# Clears the screen, sets the terminal's title, forges a status line; C1 CSI and a bidi override too.
HOSTILE_HOST = "\x1b[2J\x1b]0;pwned\x07\nstate       failed  (forged)\r\x9b31m\u202eevil"
RAW_CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]")  # anything but the line breaks of the output itself


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_control_characters_from_attach_reach_neither_status_nor_the_log(daemon_factory, log_format):
    daemon = daemon_factory("--log-format", log_format)
    daemon.wait_state("ready")
    daemon.connection.request("attach", {"pid": 4242, "host": HOSTILE_HOST, "device": "cpu\x1b[5m"})
    cli = subprocess.run([sys.executable, "-m", "engramd", "status", "--socket", daemon.endpoint],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert not RAW_CONTROLS.search(cli.stdout), repr(cli.stdout)
    assert [line for line in cli.stdout.splitlines() if line.startswith("state")] == ["state       ready"]
    assert "\\x1b[2J\\x1b]0;pwned\\x07\\nstate       failed  (forged)\\r\\x9b31m\\u202eevil" in cli.stdout
    log = daemon.log()
    assert not RAW_CONTROLS.search(log), repr(log[-2000:])
    attached = [line for line in log.splitlines() if "attached to generation" in line]
    assert len(attached) == 1 and "\\x1b[2J" in attached[0]
    if log_format == "json":
        assert "\x1b[2J" in json.loads(attached[0])["message"].encode().decode("unicode_escape")
    assert not any(line.startswith("state       failed") for line in log.splitlines())


def test_refused_requests_cannot_fill_the_log(demo_daemon):
    """1,000 refused requests with a 60 KB id: each was logged whole (about 58 MiB here)."""
    before = os.path.getsize(demo_daemon.log_path)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(demo_daemon.endpoint)
    big_id = "x" * 60_000
    try:
        for batch in range(100):  # 10 at a time: a peer with 1 MiB of requests waiting and replies unread is cut
            for n in range(10):
                sock.send(protocol.pack({"v": "1.2", "id": big_id, "op": "no-such-op", "args": {}}))
            for n in range(10):
                assert sock.poll(10_000), f"no reply to refused request {batch * 10 + n}"
                assert protocol.unpack(sock.recv(), limit=protocol.MAX_REPLY_BYTES)["error"]["code"] == "bad_request"
    finally:
        sock.close()
    summary = wait_for(lambda: re.findall(r"(\d+) more refused requests \(bad_request\) not logged", demo_daemon.log()),
                       "the log to say how many refusals it left out", 30)
    log = demo_daemon.log()
    logged = [line for line in log.splitlines() if "refused request " in line]
    assert len(logged) + sum(int(n) for n in summary) == 1000
    assert all(len(line) < 1000 for line in logged), "an echoed id was not clipped"
    grown = os.path.getsize(demo_daemon.log_path) - before
    assert grown < 256 * 1024, f"the log grew by {grown} bytes"
    assert demo_daemon.status()["state"] == "ready"
