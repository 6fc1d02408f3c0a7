"""A re-attach whose reply the client cannot use (a malformed replica list, a missing field) must
not end the heartbeat thread: the lease it was granted goes back where it can, the reason is logged
once, and the next beat tries again.  The real daemon never sends such a reply, so the connection
here is a stand-in that answers from a script."""
from __future__ import annotations

import logging
import threading

from engram_client.attach.mapped_generation import MappedGeneration
from engram_client.client_state import ClientState
from engram_client.core.errors import UnknownClientError
from waiting import wait_for


class ScriptedConnection:
    """Answers each request with the next reply of ``replies``; records what was asked."""

    def __init__(self, replies):
        self.replies, self.asked, self.daemon_version = list(replies), [], (1, 6)

    def request(self, op, args=None, timeout=None):
        self.asked.append((op, args))
        if op == "heartbeat":  # the lease is unknown until an attach succeeds
            if args.get("client_id") != "c1-good":
                raise UnknownClientError("unknown client")
            return {"boot_id": "boot-2", "generation": 3}
        return self.replies.pop(0) if op == "attach" else {}


def attach_reply(client_id: str, replicas) -> dict:
    return {"client_id": client_id, "lease_secret": "s-" + client_id, "boot_id": "boot-2", "generation": 3,
            "table_path": "/dev/shm/engram-table", "fingerprint": "fp", "replicas": replicas}


def state_on(connection) -> ClientState:
    """A client's state as if attached to an earlier daemon (boot-1), mapping its table."""
    state = ClientState(connection)
    state.boot_id = "boot-1"
    state.mapped = MappedGeneration(generation=1, path="/dev/shm/engram-table", fingerprint="fp", lease_id="c1-old")
    return state


def beat_until_reattached(state: ClientState, what: str) -> None:
    """Run the heartbeat thread until it re-attached to the new daemon (boot-2); it must still run then."""
    thread = threading.Thread(target=state.heartbeat_loop, args=(0.01,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: state.boot_id == "boot-2", what, 10.0)
        assert thread.is_alive()
    finally:
        state.stop.set()
        thread.join(timeout=10)


def test_a_malformed_reattach_reply_gives_its_lease_back_and_the_next_beat_recovers(caplog):
    good = [{"node": None, "path": "/dev/shm/engram-table"}]
    connection = ScriptedConnection([attach_reply("c1-bad", [{"node": "zero", "path": 7}]),
                                     attach_reply("c1-good", good)])
    state = state_on(connection)

    with caplog.at_level(logging.WARNING, logger="engram_client"):
        state._reattach()
    assert state.lease_lost and state.boot_id == "boot-1" and state.mapped.lease_id == "c1-old"
    assert ("detach", {"client_id": "c1-bad", "secret": "s-c1-bad"}) in connection.asked
    assert any("replica list is malformed" in r.getMessage() for r in caplog.records)

    state._reattach()
    assert not state.lease_lost and state.boot_id == "boot-2" and state.mapped.lease_id == "c1-good"
    assert state.refresh_pending, "the mapping is not the file now served (no such file here): a refresh is due"


def test_a_reattach_reply_missing_a_field_is_refused_whole_and_the_heartbeat_thread_goes_on(caplog):
    broken = attach_reply("c1-bad", None)
    del broken["fingerprint"]
    connection = ScriptedConnection([broken, attach_reply("c1-good", None)])
    state = state_on(connection)
    with caplog.at_level(logging.WARNING, logger="engram_client"):
        beat_until_reattached(state, "the second re-attach, after the broken reply")
    assert state.mapped.lease_id == "c1-good"
    assert ("detach", {"client_id": "c1-bad", "secret": "s-c1-bad"}) in connection.asked
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and "attach reply lacks fingerprint" in said[0], said


def test_the_heartbeat_thread_outlives_an_unexpected_error_in_a_beat(caplog):
    class Failing(ScriptedConnection):
        def request(self, op, args=None, timeout=None):
            if op == "heartbeat" and len(self.asked) < 3:
                self.asked.append((op, args))
                raise RuntimeError("a bug in one beat")
            return super().request(op, args, timeout)

    connection = Failing([attach_reply("c1-good", None)])
    state = state_on(connection)
    with caplog.at_level(logging.WARNING, logger="engram_client"):
        beat_until_reattached(state, "the re-attach after three failed beats")
    said = [r.getMessage() for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert len(said) == 1 and "RuntimeError: a bug in one beat" in said[0], said  # logged once, not at each beat
