"""PrefetchHandle's host-side logic: when wait() blocks, what it raises, how a timeout reads.

The event here is a stand-in object with CUDA's ``query()``; the real event, counter and
kernel are exercised on the GPU (tests/gpu/test_lookup_gpu.py)."""
from __future__ import annotations

import pytest
import torch

from engram_client import EngramTimeoutError, IdsOutOfRangeError
from engram_client.prefetch import PrefetchHandle


class NeverDone:
    def __init__(self):
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        return False


def test_a_handle_without_a_count_to_read_never_blocks():
    out = torch.arange(12, dtype=torch.float32).view(3, 4)
    handle = PrefetchHandle(out, (3,), "layer 1's rows [0, 10)")
    assert not handle.blocks_host and handle.done()
    assert torch.equal(handle.wait(), out)


def test_waiting_on_a_lookup_that_never_ends_times_out_naming_it():
    event = NeverDone()
    handle = PrefetchHandle(torch.zeros(6, 4), (2, 3), "layer 14's rows [0, 99)", event=event,
                            bad_host=torch.zeros(1, dtype=torch.int32), timeout=30.0)
    assert handle.blocks_host and not handle.done()
    with pytest.raises(EngramTimeoutError, match=r"lookup of 6 ids in layer 14's rows \[0, 99\) did not finish "
                                                 r"on the prefetch stream within 0\.1 s"):
        handle.wait(timeout=0.1)
    assert event.queries > 1 and handle.blocks_host  # it polled, and a later wait will block again


class Done:
    def query(self) -> bool:
        return True


def test_the_kernels_count_of_bad_ids_is_raised_at_every_wait():
    handle = PrefetchHandle(torch.zeros(5, 4), (5,), "layer 1's rows [0, 10)", event=Done(),
                            bad_host=torch.tensor([2], dtype=torch.int32))
    for _ in range(2):
        with pytest.raises(IdsOutOfRangeError, match="2 of 5 ids are outside layer 1's rows"):
            handle.wait()
    assert not handle.blocks_host
