"""A lookup in flight on the client's prefetch stream, and how its result is collected.

The handle keeps every tensor the kernel touches alive until the kernel is done:
the ids and the output are also recorded on the prefetch stream, so the caching
allocator will not hand their memory out again while the kernel may still use it,
even if the handle is dropped without ``wait``.

``wait`` makes the caller's current stream wait on the lookup's event.  Where the
ids were on the GPU it first blocks the host until *this lookup* has finished (not
the caller's other work): out-of-range ids on the GPU can only be reported once the
kernel has counted them.  Ids that came from the host were range-checked there
before anything was enqueued, so their ``wait`` never blocks the host.  Waiting
twice returns the same output (or raises the same error) again.
"""
from __future__ import annotations

import time

import torch

from .core.errors import EngramTimeoutError, IdsOutOfRangeError

# How the host waits for a kernel's out-of-range count: polling the event without sleeping
# for the first SPIN_S (decode-size lookups end within it, and each sleep costs tens of
# microseconds of timer slack), then sleeping POLL_S between polls (a long lookup is seen
# finished within about 0.1 ms, at a few thousand wake-ups a second).
SPIN_S = 2e-3
POLL_S = 5e-5


class PrefetchHandle:
    def __init__(self, out: torch.Tensor, shape: tuple[int, ...], describe: str, event=None, bad_host=None,
                 keep_alive: tuple = (), timeout: float = 60.0):
        self._out = out
        self._shape = shape
        self._describe = describe
        self._event = event
        self._bad_host = bad_host  # None: nothing left to check on the host
        self._keep_alive = keep_alive
        self._timeout = timeout
        self._error: Exception | None = None
        self._checked = bad_host is None

    @property
    def blocks_host(self) -> bool:
        """Whether ``wait`` has to block the host (ids on the GPU, not yet counted)."""
        return not self._checked

    def done(self) -> bool:
        return self._event is None or self._event.query()

    def wait(self, timeout: float | None = None) -> torch.Tensor:
        """The output [*ids.shape, head_dim]; raises IdsOutOfRangeError if any id was out of range."""
        if not self._checked:
            self._block_until_done(self._timeout if timeout is None else timeout)
            bad = int(self._bad_host[0])
            if bad:
                self._error = IdsOutOfRangeError(f"{bad} of {self._out.shape[0]} ids are outside {self._describe}; "
                                                 "their rows were not read")
            self._keep_alive = ()
            self._checked = True
        if self._error is not None:
            raise self._error
        if self._event is not None:
            torch.cuda.current_stream(self._out.device).wait_event(self._event)
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
