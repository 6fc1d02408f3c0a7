"""The words a UVA lookup captured in a CUDA graph reads and writes at every replay (and an eager
decode-size call of the same client, so that it needs no count of its own: uva_words_prefetch).

A graph holds raw addresses: it may be replayed after its client closed or moved to another
generation, and long after the tensors of the call that captured it are gone.  So a captured UVA
launch reads no memory that can go away without telling it:

- ``armed`` (device): 1 while the rows it addresses are mapped; ``release`` writes 0, after which
  a replay reads nothing from the table and returns zeros (the host path's disarm, in its terms);
- ``bad`` (device): the out-of-range ids its replays counted, a running total never reset;
- ``seen`` (pinned host): ``bad`` copied out after every replay, which the table's OutOfRangeLedger
  reads at the next call without waiting for anything.

The words are never freed: a graph may outlive every Python object of the call.  One set is taken
per table and generation when the table is made or swapped, outside any capture, by a client that
may capture on the kernel (LookupConfig.captures_uva): three words, bounded by the refreshes of the
process, from blocks of WORDS_PER_BLOCK.
"""
from __future__ import annotations

import logging
import threading

import torch

log = logging.getLogger("engram_client")
WORDS_PER_BLOCK = 1024
# How long release waits for the device's work in flight (a replay still reading the rows).  A
# device held up for longer (a collective whose peers are gone) must not hold the client's close
# or its process's exit with it: release then clears the word without waiting, and says so.
DRAIN_TIMEOUT_S = 60.0
_lock = threading.Lock()
_blocks: dict[torch.device, list] = {}  # device -> [device block, pinned block, next free word]
_kept: list[torch.Tensor] = []  # every block ever made: referenced here, so never freed


class GraphWords:
    def __init__(self, device: torch.device):
        with _lock:
            block = _blocks.get(device)
            if block is None or block[2] + 2 > WORDS_PER_BLOCK:
                block = [torch.zeros(WORDS_PER_BLOCK, dtype=torch.int32, device=device),
                         torch.zeros(WORDS_PER_BLOCK // 2, dtype=torch.int32, device="cpu", pin_memory=True), 0]
                _kept.extend(block[:2])
                _blocks[device] = block
            at = block[2]
            block[2] += 2
        self.device = device
        self.armed, self.bad = block[0][at:at + 1], block[0][at + 1:at + 2]
        self.seen = block[1][at // 2:at // 2 + 1]
        self.armed.fill_(1)  # on the current stream, before any capture that reads it
        torch.cuda.current_stream(device).synchronize()

    def after_launch(self) -> None:
        """Copy the running total out (on the current stream, after the kernel that adds to it)."""
        self.seen.copy_(self.bad, non_blocking=True)

    def release(self, timeout: float = DRAIN_TIMEOUT_S) -> None:
        """The rows are going away: replays from now on read nothing.  Every stream of the device is
        waited for first (a replay running now still reads the rows), then ``armed`` is cleared;
        each wait is bounded by ``timeout``."""
        drained = device_idle(self.device, timeout, "replays of graphs that read this table to finish")
        self.armed.fill_(0)
        if drained:
            device_idle(self.device, timeout, "the word that stops this table's graph replays to be written")


def device_idle(device: torch.device, timeout: float, waiting_for: str) -> bool:
    """Wait up to ``timeout`` for every stream of ``device`` (torch.cuda.synchronize, which cannot be
    bounded itself, on a thread of its own); False, with a warning naming what it waited for, if not."""
    done = threading.Event()

    def wait() -> None:
        torch.cuda.synchronize(device)
        done.set()

    threading.Thread(target=wait, name="engram-graph-drain", daemon=True).start()
    if done.wait(timeout):
        return True
    log.warning("engram_client: waited %.0f s on %s for %s; going on without them (the device is held up "
                "elsewhere)", timeout, device, waiting_for)
    return False
