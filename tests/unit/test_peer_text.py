"""What peers make the daemon print: control characters escaped, echoes clipped, repeats counted."""
from __future__ import annotations

import logging

from engramd.guards import log_limit
from engramd.guards.log_limit import LogLimiter, clip
from engramd.guards.printable import printable, printable_lines
from engramd.reporting.status_text import render_status


def test_controls_are_escaped_and_printable_text_is_kept():
    assert printable("\x1b[2J\x1b]0;t\x07\n\r\t\x7f\x9b\u202e\u200b\u2028\U000e0041") == \
        "\\x1b[2J\\x1b]0;t\\x07\\n\\r\\t\\x7f\\x9b\\u202e\\u200b\\u2028\\U000e0041"
    assert printable("rank-3.node-é.例え") == "rank-3.node-é.例え"
    assert printable_lines("Traceback\n  \x1b[31m") == "Traceback\n  \\x1b[31m"


def test_status_text_escapes_a_clients_host():
    status = {"state": "ready", "generation": 1, "boot_id": "b", "checkpoint": "<demo>", "table_bytes": 0,
              "layers": [], "clients": [{"id": "c1-0", "pid": 1, "host": "\x1b[2J\nstate       failed",
                                         "device": "cpu", "rank": None, "generation": 1}]}
    lines = render_status(status)
    assert not any("\x1b" in line or "\n" in line for line in lines)
    assert [line for line in lines if line.startswith("state")] == ["state       ready"]


def test_clip_says_how_much_it_left_out():
    assert clip("x" * 10, 20) == "x" * 10
    assert clip("x" * 250, 200) == "x" * 200 + "... (50 more characters)"


def test_repeats_past_the_window_budget_are_counted_then_reported(monkeypatch, caplog):
    now = [100.0]
    monkeypatch.setattr(log_limit.time, "monotonic", lambda: now[0])
    limiter = LogLimiter(logging.getLogger("t"), lines=3, window_s=10.0)
    with caplog.at_level(logging.WARNING, logger="t"):
        for n in range(50):
            limiter.warning("refused requests (bad_request)", "refused %d", n)
        limiter.warning("cut peers", "cut")  # another kind has its own budget
        limiter.flush()
        assert [r.getMessage() for r in caplog.records] == ["refused 0", "refused 1", "refused 2", "cut"]
        now[0] += 10.0
        limiter.flush()
    assert caplog.records[-1].getMessage() == "47 more refused requests (bad_request) not logged in the last 10 s"
