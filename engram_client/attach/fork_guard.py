"""What a forked child may do with the client its parent attached: let it go, and exit.

After fork(2) the child has the parent's mapping, but not its threads (the gather pool's
and libzmq's I/O thread), not a usable CUDA context, and any lock held at the moment of
the fork stays held forever.  So in a child the connection refuses every request
(connection.py), the gather pool refuses every lookup (lookup/host/engine/pool_type.c), both with
NotAttachedError, and releasing the client only retires its tables and unmaps the child's
copy of the mapping: no detach (the lease is the parent's), no CUDA call, no lock.

A new client in the child is the way on, but torch's CPU kernels run on GNU OpenMP's thread
pool, which does not survive fork(2) either: once the parent has used it, the child's first
parallel region waits forever for threads that stayed in the parent (a 5,000-row CPU lookup,
in dequantize_rows).  So a client made in a forked child first puts torch's CPU work on the
calling thread (torch.set_num_threads(1), what torch's own DataLoader does in its forked
workers) and says so; a child that wants the whole pool is started with spawn instead.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger("engram_client")

FORKED_CHILD_REASON = ("this process was forked from the one that attached this client; "
                       "the child's client is closed (make a new EngramClient in the child)")

_forked_from: int | None = None  # the parent's pid, in a process forked after this module was imported


def _note_fork() -> None:
    global _forked_from
    _forked_from = os.getppid()


os.register_at_fork(after_in_child=_note_fork)


def single_thread_torch_after_fork() -> None:
    """In a forked child whose torch runs its CPU kernels on OpenMP threads, keep them on the
    calling thread (the module docstring says why); anywhere else, touch nothing."""
    if _forked_from is None:
        return
    import torch

    threads = torch.get_num_threads()
    if threads <= 1 or "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return  # one thread already, or torch's own pool, which torch rebuilds after a fork
    torch.set_num_threads(1)
    log.warning("engram_client: this process was forked from pid %d, and torch's CPU thread pool (OpenMP) does not "
                "survive a fork: torch now runs CPU work on one thread here (torch.set_num_threads(1), was %d). "
                "For the whole pool, start the process with spawn (multiprocessing.get_context('spawn')) "
                "instead of fork", _forked_from, threads)


def release_in_forked_child(attachment) -> bool:
    """If this process is not the one that made ``attachment``, let it go as a child may and
    return True; otherwise return False and touch nothing."""
    if os.getpid() == attachment.owner_pid:
        return False
    attachment.stop.set()
    for table in attachment.tables.values():
        table._retire(FORKED_CHILD_REASON)
    attachment.tables.clear()
    mapped, attachment.mapped = attachment.mapped, None
    if mapped is not None and mapped.mapping is not None:
        mapped.mapping.close()  # the child's own copy of the address space; the parent's is untouched
    if getattr(attachment, "pool", None) is not None:
        attachment.pool.close()  # in a child the C pool only marks itself closed: its threads are the parent's
    attachment.connection.close()  # drops the parent's socket without touching it
    return True
