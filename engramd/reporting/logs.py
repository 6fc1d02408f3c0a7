"""Log output: readable lines for people, or one JSON object per line for log pipelines.

Either way every message is passed through ``printable`` (a peer's host name or request id
must not reach a terminal or a log viewer as control characters, nor forge a log line).
"""
from __future__ import annotations

import json
import logging
import sys
import time

from ..guards.printable import printable, printable_lines


class TextFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)

    def formatException(self, exc_info) -> str:
        return printable_lines(super().formatException(exc_info))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
                 "level": record.levelname.lower(), "logger": record.name, "message": printable(record.getMessage())}
        if record.exc_info:
            entry["exception"] = printable_lines(self.formatException(record.exc_info))
        return json.dumps(entry, ensure_ascii=False)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
