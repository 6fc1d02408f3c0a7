"""What a forked child may do with the client its parent attached: let it go, and exit.

After fork(2) the child has the parent's mapping, but not its threads (the gather pool's
and libzmq's I/O thread), not a usable CUDA context, and any lock held at the moment of
the fork stays held forever.  So in a child the connection refuses every request
(connection.py), the gather pool refuses every lookup (_host_gather.c), both with
NotAttachedError, and releasing the client only retires its tables and unmaps the child's
copy of the mapping: no detach (the lease is the parent's), no CUDA call, no lock.
"""
from __future__ import annotations

import os

FORKED_CHILD_REASON = ("this process was forked from the one that attached this client; "
                       "the child's client is closed (make a new EngramClient in the child)")


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
