"""How out-of-range ids reach the caller without a host synchronization on the lookup's path.

An id outside a table's rows is never read: its row comes back zeroed.  Where the ids were on
the host they are counted before anything is enqueued and the call raises at once.  Where they
were on the GPU (or replayed by a CUDA graph), the count exists only once the lookup has run:

- the host gather adds it to ``counter``, an int64 in host memory written by the gather threads;
- the UVA kernel's count is copied asynchronously into pinned memory, watched with its event;
- a decode-size UVA call of a client that captures on the kernel, replayed or eager, adds to a
  running total that every call copies into a pinned word (uva/graph_words.py): the ledger reads
  how far that word moved since it last looked.

``raise_finished`` (called at every ``prefetch()`` and ``wait()`` of the table) reads both
without waiting for anything and raises IdsOutOfRangeError for lookups that have finished
since the last report, naming the count.  In strict mode ``wait()`` first waits for its own
lookup, so its ids are reported there.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import torch

from ..core.errors import IdsOutOfRangeError


class OutOfRangeLedger:
    def __init__(self, describe):
        self.describe = describe  # a callable: the table's rows, as an error names them
        self.counter = np.zeros(1, dtype=np.int64)
        self.address = self.counter.ctypes.data
        self._reported = 0
        self._watched: deque = deque()  # (event, pinned int32 count) of UVA lookups of GPU ids
        self._totals: list[list] = []  # [pinned int32 running total, its value when last read]: GraphWords' calls

    def watch(self, event, count) -> None:
        self._watched.append((event, count))

    def watch_total(self, seen) -> None:
        """A pinned int32 copy of a running total that only grows (modulo 2**32) by the out-of-range ids
        of finished calls, replayed or eager (a late copy may show it behind what was read: nothing new)."""
        self._totals.append([seen, int(seen[0])])

    def raise_finished(self) -> None:
        total = int(self.counter[0])
        new = total - self._reported
        watched = self._watched
        # Querying an event inside a capture would invalidate the graph: those wait for an eager call.
        while watched and not _capturing() and watched[0][0].query():
            new += int(watched.popleft()[1][0])
        for running in self._totals:
            now = int(running[0][0])
            moved = (now - running[1]) % 2**32
            # A copy that landed after a later one (calls on two streams) moves the word back: nothing
            # new, and the later copy's total is counted when it lands.
            if moved < 2**31:
                new += moved
                running[1] = now
        if new:
            self._reported = total
            raise IdsOutOfRangeError(f"{new} ids in finished lookups were outside {self.describe()}; their rows "
                                     "were not read and came back as zeros")

    def drain(self) -> None:
        """Forget what is watched (the client is closing or moving to another generation)."""
        self._watched.clear()
        self._totals.clear()
        self._reported = int(self.counter[0])


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
