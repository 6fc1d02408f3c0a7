"""Lease caps per connection, per process and per user, as the kernel names them."""
from __future__ import annotations

import pytest

from engramd.guards.lease_limits import PER_PEER, PER_PROCESS, PER_USER, Holder, LeaseLimitError
from engramd.daemon.leases import LeaseRegistry


def grant(registry: LeaseRegistry, holder: Holder):
    return registry.grant(pid=1, host="h", rank=None, device="cpu", generation=1, holder=holder)


def test_one_connection_stops_at_its_cap():
    registry = LeaseRegistry(10.0)
    for _ in range(PER_PEER):
        grant(registry, Holder(b"conn", 7, 1000))
    with pytest.raises(LeaseLimitError, match="this connection holds 16"):
        grant(registry, Holder(b"conn", 7, 1000))


def test_one_process_stops_at_its_cap_whatever_its_connections():
    registry = LeaseRegistry(10.0)
    for n in range(PER_PROCESS):
        grant(registry, Holder(f"conn-{n}".encode(), 7, 1000))
    with pytest.raises(LeaseLimitError, match=r"this process \(pid 7\) holds 64"):
        grant(registry, Holder(b"new", 7, 1000))
    grant(registry, Holder(b"other", 8, 1000))  # another process of the same user still may


def test_one_user_stops_at_its_cap_and_others_still_attach():
    registry = LeaseRegistry(10.0)
    for n in range(PER_USER):
        grant(registry, Holder(f"conn-{n}".encode(), 100 + n // PER_PROCESS, 1000))
    with pytest.raises(LeaseLimitError, match="uid 1000 hold 1024"):
        grant(registry, Holder(b"new", 99_999, 1000))
    grant(registry, Holder(b"root-rank", 1, 0))


def test_a_peer_the_kernel_did_not_name_is_counted_by_connection():
    registry = LeaseRegistry(10.0)
    for n in range(PER_PROCESS + 1):
        grant(registry, Holder(f"conn-{n}".encode(), None, None))
    assert len(registry) == PER_PROCESS + 1
