"""A lookup in flight on the client's prefetch stream, and how its result is collected.

The handle keeps every tensor the lookup touches alive until it is done: the ids and the
output are also recorded on the prefetch stream, so the caching allocator will not hand
their memory out again while the lookup may still use it, even if the handle is dropped
without ``wait``.

``wait`` makes the caller's current stream wait on the lookup's event; it never blocks the
host, except in strict mode.  Out-of-range ids whose count only exists once a lookup has run
(ids on the GPU, graph replays) are reported by the table's OutOfRangeLedger at the next
``prefetch()`` or ``wait()`` after that lookup finished (out_of_range.py).  In strict mode
``wait`` first blocks the host (bounded) until *this lookup* has finished, so its own ids are
reported there, and waiting again raises the same error again.
"""
from __future__ import annotations

import time

import torch

from ..core.errors import EngramTimeoutError, IdsOutOfRangeError

# How strict mode waits for a lookup: polling the event without sleeping
# for the first SPIN_S (decode-size lookups end within it, and each sleep costs tens of
# microseconds of timer slack), then sleeping POLL_S between polls (a long lookup is seen
# finished within about 0.1 ms, at a few thousand wake-ups a second).
SPIN_S = 2e-3
POLL_S = 5e-5


class PrefetchHandle:
    __slots__ = ("_out", "_shape", "_describe", "_event", "_ledger", "_strict", "_keep_alive", "_timeout",
                 "_error", "_checked", "_owner")

    def __init__(self, out: torch.Tensor, shape: tuple[int, ...], describe: str, event=None, ledger=None,
                 strict: bool = False, keep_alive: tuple = (), timeout: float = 60.0):
        self._out = out
        self._shape = shape
        self._describe = describe
        self._event = event
        self._ledger = ledger  # the table's OutOfRangeLedger; None: nothing can be reported later
        self._strict = strict
        self._keep_alive = keep_alive
        self._timeout = timeout
        self._error: Exception | None = None
        self._checked = not strict or event is None
        self._owner = None  # the EngramTable that started it: the table (and its client) outlive the handle

    @property
    def blocks_host(self) -> bool:
        """Whether ``wait`` will block the host (strict mode, lookup not yet seen finished)."""
        return not self._checked

    def done(self) -> bool:
        return self._event is None or self._event.query()

    def wait(self, timeout: float | None = None) -> torch.Tensor:
        """The output [*ids.shape, head_dim]; raises IdsOutOfRangeError for out-of-range ids of
        lookups that have finished (in strict mode: this one's, after waiting for it)."""
        if self._error is not None:
            raise self._error
        if not self._checked:
            # A capture cannot wait for its own work: under capture, strict mode reports at a later call.
            if self._out.device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
                self._block_until_done(self._timeout if timeout is None else timeout)
            self._checked = True
        if self._ledger is not None:
            try:
                self._ledger.raise_finished()
            except IdsOutOfRangeError as exc:
                if self._strict:
                    self._error = exc
                raise
        event = self._event
        if event is not None:
            if isinstance(event, torch.cuda.Event):
                torch.cuda.current_stream(self._out.device).wait_event(event)
            else:  # the host path's slot: its own CUDA event, joined in C
                event.join(torch._C._cuda_getCurrentRawStream(self._out.device.index))
        return self._out.view(*self._shape, self._out.shape[-1])

    def _block_until_done(self, timeout: float) -> None:
        started = time.monotonic()
        deadline = started + timeout
        while not self._event.query():
            now = time.monotonic()
            if now > deadline:
                raise EngramTimeoutError(f"lookup of {self._out.shape[0]} ids in {self._describe} did not finish "
                                         f"on the prefetch stream within {timeout:.1f} s")
            # sleep(0) still lets other threads (the client's heartbeat) take the GIL.
            time.sleep(0 if now - started < SPIN_S else POLL_S)
