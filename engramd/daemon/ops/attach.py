"""The attach operation: a rank asks for a lease on the served table."""
from __future__ import annotations

from engram_client.core.errors import ProtocolError

from ...guards.lease_limits import DEVICE_CHARS, HOST_CHARS, Holder
from ...shm.numa import MAX_NODE
from .args import arg


class Attach:
    """Grant a lease on the ready table; the reply names the file to map and the lease's secret.

    ``peer`` is who asks (the connection, and the process and user the kernel names): the
    lease counts against each (lease_limits.py).  ``numa_node``: the client's node, which picks the
    replica it maps (daemon/replicas.py) and is listed in status."""
    name = "attach"

    def execute(self, daemon, args, peer: Holder = Holder()):
        pid = arg(args, "pid", int)
        if pid <= 0:
            raise ProtocolError(f"argument 'pid' must be positive, got {pid}")
        rank = arg(args, "rank", (int, type(None)), default=None)
        numa_node = arg(args, "numa_node", (int, type(None)), default=None)  # protocol 1.4
        if numa_node is not None and not 0 <= numa_node <= MAX_NODE:
            raise ProtocolError(f"argument 'numa_node' must be a NUMA node 0..{MAX_NODE} or null, got {numa_node}")
        return daemon.attach(pid=pid, host=arg(args, "host", str, default="", max_len=HOST_CHARS), rank=rank,
                             device=arg(args, "device", str, default="cpu", max_len=DEVICE_CHARS), peer=peer,
                             numa_node=numa_node)
