"""A load's progress, shown where the operator looks: a bar on a terminal, log lines elsewhere.

    on a terminal      loading [#########.....] 61.0%  23.2/38.1 MiB      (redrawn in place)
    anywhere else      generation 1: 23.2/38.1 MiB loaded (61%), 4.2 MB/s, about 4 s left

The bar ends cleanly: it is drawn at its final value and ends its line before any
log record is written and when the load ends.  A log handler writing to the bar's own
stream writes through the bar (``_AfterTheBar``), which ends the line and writes the
record under one lock, so no redraw can fall between the two; other handlers end the
line from a filter, which sees each record first.  Log lines come every
``LOG_INTERVAL_S`` seconds, so systemd, Kubernetes and log files see a long load move.  The server thread calls
``watch(daemon.loading_generation())`` on every poll; the load thread only ever writes log records.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, TextIO

from .sizes import human_pair

LOG_INTERVAL_S = 3.0
log = logging.getLogger("engramd.progress")


def render(done: int, total: int, width: int = 30) -> str:
    fraction = done / total if total else 0.0
    filled = int(fraction * width)
    return f"loading [{'#' * filled}{'.' * (width - filled)}] {fraction * 100:5.1f}% {human_pair(done, total)}"


class ProgressBar:
    """One line on a terminal, redrawn in place while a load runs."""

    WIDTH = 30

    def __init__(self, stream: TextIO, interval: float = 0.25) -> None:
        self.stream = stream
        self.interval = interval
        self._last = 0.0
        self._snapshot: Callable[[], dict[str, int]] | None = None
        self._drawn = False
        self._lock = threading.Lock()
        self._filter = _EndBarFirst(self)
        self._through_bar: list[logging.StreamHandler] = []  # handlers whose writes now go through _AfterTheBar
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is stream:
                handler.setStream(_AfterTheBar(self))
                self._through_bar.append(handler)
            else:
                handler.addFilter(self._filter)

    def watch(self, generation: Any) -> None:
        """Show ``generation``'s load (None: no load runs)."""
        if generation is None:
            self.end_line()
            self._snapshot = None
            return
        self._snapshot = generation.progress.snapshot
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            with self._lock:
                self._draw()

    def _draw(self) -> None:  # with self._lock held
        if self._snapshot is None:
            return
        load = self._snapshot()
        self.stream.write("\r" + render(load["done_bytes"], load["total_bytes"], self.WIDTH))
        self.stream.flush()
        self._drawn = True

    def end_line(self) -> None:
        """Draw the bar at its latest value and end its line, if it is on screen."""
        with self._lock:
            self._end_line()

    def _end_line(self) -> None:  # with self._lock held
        if not self._drawn:
            return
        self._draw()
        self.stream.write("\n")
        self.stream.flush()
        self._drawn = False

    def close(self) -> None:
        self.end_line()
        for handler in logging.getLogger().handlers:
            handler.removeFilter(self._filter)
        for handler in self._through_bar:
            if isinstance(handler.stream, _AfterTheBar):
                handler.setStream(self.stream)


class _AfterTheBar:
    """The bar's stream as a log handler writes to it: each write first ends the bar's line, under
    the bar's lock (a StreamHandler writes a record and its newline in one call)."""

    def __init__(self, bar: ProgressBar) -> None:
        self.bar = bar

    def write(self, text: str) -> int:
        with self.bar._lock:
            self.bar._end_line()
            return self.bar.stream.write(text)

    def flush(self) -> None:
        self.bar.stream.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, name: the stream's own
        return getattr(self.bar.stream, name)


class _EndBarFirst(logging.Filter):
    """Ends the bar's line before a log record is written, so the record starts a line of its own."""

    def __init__(self, bar: ProgressBar) -> None:
        super().__init__()
        self.bar = bar

    def filter(self, record: logging.LogRecord) -> bool:
        self.bar.end_line()
        return True


class ProgressLog:
    """A log line every ``interval`` seconds of a load: bytes, rate, time left."""

    def __init__(self, interval: float = LOG_INTERVAL_S) -> None:
        self.interval = interval
        self._watched: Any = None
        self._started = self._last = 0.0

    def watch(self, generation: Any) -> None:
        """Show ``generation``'s load (None: no load runs)."""
        now = time.monotonic()
        if generation is not self._watched:
            self._watched = generation
            # The server sees a load within one poll of its start, so every byte done counts: a
            # throttled load copies a whole chunk at once and then pauses, and a rate measured
            # from the first sighting would read 0 until the next chunk.
            self._started = self._last = now
            return
        if generation is None or now - self._last < self.interval:
            return
        self._last = now
        load = generation.progress.snapshot()
        done, total = load["done_bytes"], load["total_bytes"]
        rate = done / max(now - self._started, 1e-9)
        left = f"about {(total - done) / rate:.0f} s left" if rate > 0 else "no bytes copied yet"
        log.info("generation %d: %s loaded (%.0f%%), %.1f MB/s, %s", generation.number, human_pair(done, total),
                 100 * done / total, rate / 1e6, left)

    def close(self) -> None:
        pass


def progress_for(stream: TextIO, bar: bool) -> ProgressBar | ProgressLog:
    return ProgressBar(stream) if bar else ProgressLog()
