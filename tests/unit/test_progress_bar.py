"""The load bar on a terminal and the log records written beside it: a record always starts a line
of its own, even when the server thread redraws the bar just before the record is written (the
load thread logs "generation 1 ready" while the server thread polls).  Real logging handlers on an
in-memory stream; the redraw is forced into that window by a filter of the handler's own."""
from __future__ import annotations

import io
import logging
import re
from types import SimpleNamespace

import pytest

from engramd.reporting.progress import ProgressBar

MIB = 1 << 20


@pytest.fixture
def terminal():
    stream, root = io.StringIO(), logging.getLogger()
    handler = logging.StreamHandler(stream)
    saved = root.handlers[:]
    root.handlers[:] = [handler]
    try:
        yield stream, handler
    finally:
        root.handlers[:] = saved


def loading(done: int, total: int):
    return SimpleNamespace(progress=SimpleNamespace(snapshot=lambda: {"done_bytes": done, "total_bytes": total}))


def test_a_record_never_follows_a_bar_redrawn_just_before_it_on_the_same_line(terminal):
    stream, handler = terminal
    bar = ProgressBar(stream, interval=0)
    load = loading(30 * MIB, 30 * MIB)
    bar.watch(load)

    class RedrawFirst(logging.Filter):  # the server thread's redraw, after the bar's filters, before the write
        def filter(self, record):
            bar.watch(load)
            return True

    handler.addFilter(RedrawFirst())
    logging.getLogger("engramd").warning("generation 1 ready")
    logging.getLogger("engramd").warning("state -> ready")
    bar.close()
    out = stream.getvalue()
    assert re.search(r"\] 100\.0% 30\.0/30\.0 MiB\ngeneration 1 ready\n", out), repr(out)
    assert re.search(r"MiB\nstate -> ready\n$", out), repr(out)
    assert "MiBgeneration" not in out and "MiBstate" not in out, repr(out)
    assert handler.stream is stream, "close gives the handler its stream back"


def test_a_handler_on_another_stream_keeps_its_stream_and_still_ends_the_bar_first(terminal):
    stream, _ = terminal
    other = io.StringIO()
    elsewhere = logging.StreamHandler(other)
    logging.getLogger().handlers[:] = [elsewhere]  # a log file, say, while the bar is on the terminal
    bar = ProgressBar(stream, interval=0)
    bar.watch(loading(3 * MIB, 30 * MIB))
    logging.getLogger("engramd").warning("a line in the file")
    assert elsewhere.stream is other and other.getvalue() == "a line in the file\n"
    assert re.search(r"\]  10\.0% 3\.0/30\.0 MiB\n$", stream.getvalue()), repr(stream.getvalue())
    bar.close()
