"""One table generation as a client holds it: the read-only mapping and, on CUDA, its
registrations and GPU views, one per layer (whole, or the rows of ``row_ranges``), and the hot-row
list the daemon serves with it (``hot_list``: hot_rows.py; None without one)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch

from ..core.errors import CudaRegistrationError, TableFileError
from ..core.layout import LayerLayout
from ..core.hot_list import HotList
from .hot_rows import open_hot_list
from .mapping import ReadOnlyMapping, open_table_file
from ..core.table_file import read_header

PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class LayerView:
    layout: LayerLayout
    view: torch.Tensor  # uint8 bytes of rows [lo, hi): the host mapping, or on CUDA its UVA view
    lo: int
    hi: int
    host_view: torch.Tensor  # the same bytes in the host mapping (what the host gather reads)


@dataclass
class MappedGeneration:
    generation: int
    path: str
    fingerprint: str
    lease_id: str
    lease_secret: str = ""  # renewing or releasing the lease takes it (protocol 1.2)
    mapping: ReadOnlyMapping | None = None
    registrations: list = field(default_factory=list)
    layers: dict[int, LayerView] = field(default_factory=dict)
    hot_list: HotList | None = None  # the daemon's hot-row list for this table (protocol 1.4)
    hot_list_seconds: float = 0.0  # how long reading and checking it took at attach
    replica_node: int | None = None  # the NUMA node of the replica mapped (None: the one unbound table)

    @classmethod
    def open(cls, reply: dict, device: torch.device, row_ranges: dict[int, tuple[int, int]],
             daemon_uid: int | None = None, replica: dict | None = None) -> "MappedGeneration":
        """Map (and on CUDA register and verify) the table an attach reply names; ``daemon_uid``:
        the owner of the socket the reply came through, whose table files are trusted too;
        ``replica``: the {"node", "path"} of the reply's replicas to map (default: ``table_path``)."""
        path = replica["path"] if replica else reply["table_path"]
        fd = open_table_file(path, daemon_uid)  # owner checked on the descriptor; header, size and mapping from it too
        try:
            # The file must hold all the header says (read_header checks its size): pages past
            # its end would kill this process with SIGBUS at the first read.
            header, _ = read_header(path, fd=fd)
            if header.fingerprint != reply["fingerprint"]:
                raise TableFileError(f"{path}: fingerprint {header.fingerprint} is not the daemon's "
                                     f"{reply['fingerprint']}")
            unknown = set(row_ranges) - {entry.layout.layer for entry in header.layers}
            if unknown:
                raise ValueError(f"row_ranges names layers {sorted(unknown)} that the table does not have")
            mapped = cls(reply["generation"], path, header.fingerprint, reply["client_id"],
                         reply.get("lease_secret", ""), replica_node=(replica or {}).get("node"))
            began = time.monotonic()
            mapped.hot_list = open_hot_list(reply.get("hot_rows"), path, [e.layout for e in header.layers],
                                            header.fingerprint, daemon_uid)
            mapped.hot_list_seconds = time.monotonic() - began
            mapping = ReadOnlyMapping(path, header.total_bytes, fd)
        finally:
            os.close(fd)
        try:
            mapped.mapping = mapping
            for entry in header.layers:
                layout = entry.layout
                lo, hi = row_ranges.get(layout.layer, (0, layout.rows))
                if not (0 <= lo < hi <= layout.rows):
                    raise ValueError(f"row_ranges[{layout.layer}] = ({lo}, {hi}) is not within [0, {layout.rows})")
                start, nbytes = entry.offset + lo * layout.row_bytes, (hi - lo) * layout.row_bytes
                host_view = mapped.mapping.tensor(start, nbytes)
                view = mapped._register(host_view, start, nbytes, device) if device.type == "cuda" else host_view
                mapped.layers[layout.layer] = LayerView(layout, view, lo, hi, host_view)
        except BaseException:
            mapped.release()
            raise
        return mapped

    def _register(self, host_view: torch.Tensor, start: int, nbytes: int, device: torch.device) -> torch.Tensor:
        """Register [start, start + nbytes) of the mapping (page-rounded) and return its GPU view."""
        from .registration import HostRegistration

        lo = start // PAGE * PAGE
        hi = -(-(start + nbytes) // PAGE) * PAGE
        registration = HostRegistration(self.mapping.address + lo, min(hi, self.mapping.nbytes) - lo, device)
        self.registrations.append(registration)
        view = registration.tensor()[start - lo:start - lo + nbytes]
        # Prove the GPU sees the table's bytes: compare the first and last 4 KiB with the host mapping.
        probe = min(4096, nbytes)
        for host_part, device_part in ((host_view[:probe], view[:probe]), (host_view[-probe:], view[-probe:])):
            if not torch.equal(device_part.cpu(), host_part):
                raise CudaRegistrationError(f"{self.path}: the GPU reads different bytes than the host "
                                            "at a registered range; refusing to serve from it")
        return view

    def release(self) -> None:
        """Unregister and unmap.  Callers make sure no kernel still reads these pages."""
        self.layers.clear()
        while self.registrations:
            self.registrations.pop().unregister()
        if self.mapping is not None:
            self.mapping.close()
            self.mapping = None


def describe_move(old: MappedGeneration, new: MappedGeneration) -> str:
    """What a refresh moved between, for the log: a restarted daemon numbers its first generation 1
    again, and "from generation 1 to 1" would read as no move at all."""
    if new.generation == old.generation:
        return f"to the restarted daemon's generation {new.generation} ({new.path}), from its predecessor's ({old.path})"
    return f"from generation {old.generation} to {new.generation} ({new.path})"
