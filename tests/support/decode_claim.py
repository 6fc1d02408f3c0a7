"""A claim that a rank of budget group 0 decodes: a thread of this process writes the present into
the group's ``decode_at`` every few ms, as a decoding rank's calls do, for as long as the with-block
lasts.  It writes the shared memory a peer process would write; tests use it where a real decoding
rank's timing would race the 100 ms window (``budget_file.DECODE_QUIET_NS``).

    with DecodeClaim(mapped) as claim:   # mapped: the budget memfd mapped writable
        ...
        claim.longest_gap_ms             # the longest pause between two stamps since start or reset()
"""
from __future__ import annotations

import struct
import threading
import time

from engram_client.core import budget_file

DECODE_AT = budget_file.GROUPS_AT + budget_file.GROUP_DECODE_AT  # group 0's


class DecodeClaim:
    def __init__(self, mapped, every_s: float = 0.002):
        self.mapped, self.every_s = mapped, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._claim, name="decode-claim", daemon=True)
        self._longest = 0.0

    def _claim(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.every_s):
            struct.pack_into("<q", self.mapped, DECODE_AT, time.monotonic_ns())
            now = time.monotonic()
            self._longest, last = max(self._longest, now - last), now

    def reset(self) -> None:
        self._longest = 0.0

    @property
    def longest_gap_ms(self) -> float:
        return self._longest * 1000

    def __enter__(self) -> "DecodeClaim":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
