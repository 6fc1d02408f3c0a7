"""Giving freed heap memory back to the system after bursts of peer traffic.

A burst of peers (thousands of requests, large replies dropped unread, connections opened
and closed) leaves glibc's heap holding freed chunks, and the daemon's RSS would keep the
burst's high-water mark for its whole life.  Once a minute the server loop calls
malloc_trim(0), so what the daemon holds tracks what it uses.  Where the C library has
no malloc_trim (musl), this does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import time

TRIM_EVERY_S = 60.0


def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
    return trim


class HeapTrimmer:
    def __init__(self, every_s: float = TRIM_EVERY_S):
        self.every_s = every_s
        self._trim = _malloc_trim()
        self._last = time.monotonic()

    def maybe_trim(self) -> None:
        now = time.monotonic()
        if self._trim is not None and now - self._last >= self.every_s:
            self._last = now
            self._trim(0)
