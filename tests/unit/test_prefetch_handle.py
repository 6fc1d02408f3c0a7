"""PrefetchHandle's and OutOfRangeLedger's host-side logic: when wait() blocks, what it raises and when.

The events here are stand-ins with CUDA's ``query()``; the real events, counters and kernels
are exercised on the GPU (tests/gpu/test_lookup_gpu.py, tests/gpu/test_host_path_gpu.py)."""
from __future__ import annotations

import pytest
import torch

from engram_client import EngramTimeoutError, IdsOutOfRangeError
from engram_client.lookup.out_of_range import OutOfRangeLedger
from engram_client.lookup.prefetch import PrefetchHandle

ROWS = "layer 14's rows [0, 99)"


class Event:
    def __init__(self, done: bool = False):
        self.is_done, self.queries = done, 0

    def query(self) -> bool:
        self.queries += 1
        return self.is_done


def ledger() -> OutOfRangeLedger:
    return OutOfRangeLedger(lambda: ROWS)


def test_a_handle_without_an_event_never_blocks():
    out = torch.arange(12, dtype=torch.float32).view(3, 4)
    handle = PrefetchHandle(out, (3,), ROWS)
    assert not handle.blocks_host and handle.done()
    assert torch.equal(handle.wait(), out)


def test_only_strict_mode_blocks_and_its_wait_times_out_naming_the_lookup():
    lenient = PrefetchHandle(torch.zeros(6, 4), (2, 3), ROWS, event=Event(done=False), ledger=ledger())
    assert not lenient.blocks_host
    event = Event(done=False)
    strict = PrefetchHandle(torch.zeros(6, 4), (2, 3), ROWS, event=event, ledger=ledger(), strict=True, timeout=30.0)
    assert strict.blocks_host and not strict.done()
    with pytest.raises(EngramTimeoutError, match=r"lookup of 6 ids in layer 14's rows \[0, 99\) did not finish "
                                                 r"on the prefetch stream within 0\.1 s"):
        strict.wait(timeout=0.1)
    assert event.queries > 1 and strict.blocks_host  # it polled, and a later wait will block again


def test_the_gather_counter_is_reported_once_at_the_next_call():
    book = ledger()
    book.raise_finished()  # nothing yet
    book.counter[0] += 3  # what the gather threads do for three bad ids
    with pytest.raises(IdsOutOfRangeError, match=r"3 ids in finished lookups were outside layer 14's rows"):
        book.raise_finished()
    book.raise_finished()  # reported once
    book.counter[0] += 1
    book.drain()  # closing or moving on: what is pending is dropped
    book.raise_finished()


def test_a_kernel_count_is_reported_only_once_its_lookup_has_finished():
    book = ledger()
    first, second = Event(done=False), Event(done=False)
    book.watch(first, torch.tensor([2], dtype=torch.int32))
    book.watch(second, torch.tensor([5], dtype=torch.int32))
    book.raise_finished()  # neither finished: no host wait, nothing to say
    second.is_done = True
    book.raise_finished()  # watched in order: the second waits behind the first
    first.is_done = True
    with pytest.raises(IdsOutOfRangeError, match="7 ids in finished lookups"):
        book.raise_finished()
    book.raise_finished()


def test_strict_wait_raises_its_own_lookups_error_at_every_wait():
    book = ledger()
    event = Event(done=True)
    book.watch(event, torch.tensor([2], dtype=torch.int32))
    handle = PrefetchHandle(torch.zeros(5, 4), (5,), ROWS, event=event, ledger=book, strict=True)
    for _ in range(2):
        with pytest.raises(IdsOutOfRangeError, match="2 ids in finished lookups were outside"):
            handle.wait()
    assert not handle.blocks_host


def test_a_captured_lookups_running_total_is_reported_by_how_far_it_moved():
    """A UVA lookup captured in a graph adds its out-of-range ids to a running total, copied into a
    pinned word at every replay (a plain CPU tensor here): each call reports what the word gained
    since the last look, once, across a wrap of 32 bits, and nothing once the ledger is drained."""
    book = ledger()
    seen = torch.tensor([2**31 - 2], dtype=torch.int32)  # replays before the table watched it count for nothing
    book.watch_total(seen)
    book.raise_finished()
    seen[0] = -2**31 + 3  # five more, across the wrap
    with pytest.raises(IdsOutOfRangeError, match=r"^5 ids in finished lookups were outside layer 14's rows \[0, 99\)"):
        book.raise_finished()
    book.raise_finished()  # reported once
    seen[0] += 1
    book.drain()  # the generation went: its graphs read nothing more, and what was left is forgotten
    book.raise_finished()


def test_a_running_total_that_a_late_copy_moved_back_reports_nothing_until_the_later_copy_lands():
    """Calls on two streams (an eager decode-size call beside a replay) each copy the total out: the
    older copy may land last.  The word going back is no new id, and the ids counted in the later
    copy are reported once, when the word shows them again."""
    book = ledger()
    seen = torch.tensor([10], dtype=torch.int32)
    book.watch_total(seen)
    book.raise_finished()
    seen[0] = 7  # a stale copy, three behind what the ledger read
    book.raise_finished()  # nothing: not 2**32 - 3 ids
    seen[0] = 12
    with pytest.raises(IdsOutOfRangeError, match="^2 ids in finished lookups"):
        book.raise_finished()
    book.raise_finished()
