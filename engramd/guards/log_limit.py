"""Log lines that peers cause, bounded: what is echoed is clipped, and repeats are counted, not written.

A peer can send thousands of refused requests a second, each echoing up to 64 KiB of its own
bytes; logged in full they filled a disk (2,000 requests with a 60 KB id: 115 MiB in 1.3 s).
So each echoed value is clipped to ECHO_CHARS, and of each kind of line (a refusal's error
code, a cut peer) at most LINES are written per WINDOW_S seconds; the rest are counted, and
when the window ends one line says how many were left out.  Kinds are a small fixed set, so
the counters are bounded too.
"""
from __future__ import annotations

import logging
import time

LINES = 20
WINDOW_S = 10.0
ECHO_CHARS = 200


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """``text``, or its first ``limit`` characters and how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


class LogLimiter:
    def __init__(self, logger: logging.Logger, lines: int = LINES, window_s: float = WINDOW_S):
        self.logger = logger
        self.lines = lines
        self.window_s = window_s
        self._windows: dict[str, list] = {}  # kind -> [window start, lines written, lines left out]

    def log(self, level: int, kind: str, message: str, *args, **kwargs) -> None:
        """Log ``message % args`` unless ``kind`` had its LINES in this window already."""
        now = time.monotonic()
        window = self._windows.get(kind)
        if window is None or now - window[0] >= self.window_s:
            self._report(kind, window, now)
            window = self._windows[kind] = [now, 0, 0]
        if window[1] < self.lines:
            window[1] += 1
            self.logger.log(level, message, *args, **kwargs)
        else:
            window[2] += 1

    def warning(self, kind: str, message: str, *args) -> None:
        self.log(logging.WARNING, kind, message, *args)

    def flush(self) -> None:
        """Report the windows that ended (the server loop calls this often)."""
        now = time.monotonic()
        for kind, window in list(self._windows.items()):
            if now - window[0] >= self.window_s:
                self._report(kind, window, now)
                del self._windows[kind]

    def _report(self, kind: str, window: list | None, now: float) -> None:
        if window is not None and window[2]:
            self.logger.warning("%d more %s not logged in the last %.0f s", window[2], kind, now - window[0])
