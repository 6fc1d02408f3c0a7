"""A lookup in flight on the client's prefetch stream, and how its result is collected.

The handle keeps every tensor the kernel touches alive until the kernel is done:
the ids and the output are also recorded on the prefetch stream, so the caching
allocator will not hand their memory out again while the kernel may still use it,
even if the handle is dropped without ``wait``.

``wait`` blocks the host until *this lookup* has finished (not the caller's other
work): out-of-range ids can only be reported once the kernel has counted them.
It then makes the caller's current stream wait on the lookup's event.  Waiting
twice returns the same output (or raises the same error) again.
"""
from __future__ import annotations

import time

import torch

from .errors import EngramTimeoutError, IdsOutOfRangeError


class PrefetchHandle:
    def __init__(self, out: torch.Tensor, shape: tuple[int, ...], describe: str, event=None, bad_host=None,
                 keep_alive: tuple = (), timeout: float = 60.0):
        self._out = out
        self._shape = shape
        self._describe = describe
        self._event = event
        self._bad_host = bad_host
        self._keep_alive = keep_alive
        self._timeout = timeout
        self._error: Exception | None = None
        self._checked = event is None

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
        deadline = time.monotonic() + timeout
        pause = 0.0
        while not self._event.query():
            if time.monotonic() > deadline:
                raise EngramTimeoutError(f"lookup of {self._out.shape[0]} ids in {self._describe} did not finish "
                                         f"on the prefetch stream within {timeout:.1f} s")
            time.sleep(pause)
            pause = min(1e-3, pause + 2e-5)  # spin briefly, then back off to a light poll
