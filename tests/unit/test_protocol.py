"""engram_client.core.protocol and the daemon's operation handlers, without sockets.

The handlers are called the circus way, ``OPERATIONS[op].execute(daemon, args)``, on a
real Daemon whose shm dir is a temp dir; nothing is bound, nothing is sent.
"""
from __future__ import annotations

import os
import tempfile
import time

import msgpack
import pytest

from engram_client.core import endpoints, protocol
from engram_client.core.errors import NotReadyError, ProtocolError, UnknownClientError
from engramd.daemon.config import ServeConfig
from engram_client.core.protocol import LOADING, READY, STOPPING
from engramd.daemon.state_machine import Daemon
from engramd.daemon.ops import OPERATIONS
from engramd.reporting.progress import render


# -- framing -----------------------------------------------------------------------------
def test_pack_unpack_round_trip():
    message = {"v": "1.0", "id": "req-é", "op": "attach",
               "args": {"pid": 123, "rank": None, "blob": b"\x00\xff", "nested": {"a": [1, 2.5, True]}}}
    frame = protocol.pack(message)
    assert isinstance(frame, bytes)
    back = protocol.unpack(frame)
    assert back == message
    assert isinstance(back["args"]["blob"], bytes) and isinstance(back["id"], str)  # bin stays bin, str stays str


@pytest.mark.parametrize("frame,expected", [
    (b"\xc1", "not valid msgpack"),            # 0xc1 is never used by msgpack
    (b"\x92\x01", "not valid msgpack"),        # an array that claims 2 items but has 1
    (msgpack.packb([1, 2, 3]), "must be a map"),
    (msgpack.packb("status"), "must be a map"),
    (msgpack.packb(7), "must be a map"),
    (msgpack.packb({1: "integer key"}), "not valid msgpack"),  # strict_map_key: keys are str or bytes
])
def test_unpack_refuses_what_is_not_a_map(frame, expected):
    with pytest.raises(ProtocolError, match=expected):
        protocol.unpack(frame)


def test_unpack_refuses_oversized_frames_before_decoding():
    limit = protocol.MAX_REQUEST_BYTES
    at_limit = protocol.pack({"pad": b"x" * (limit - 8)})  # 8 bytes of map, key and bin16 header
    assert len(at_limit) == limit
    assert protocol.unpack(at_limit)["pad"].startswith(b"x")
    with pytest.raises(ProtocolError, match=f"exceeds the {limit}-byte limit"):
        protocol.unpack(protocol.pack({"pad": b"x" * limit}))
    with pytest.raises(ProtocolError, match="exceeds"):
        protocol.unpack(b"\xc1" * (limit + 1))  # refused for its size, not parsed at all


# -- versions and requests ---------------------------------------------------------------
@pytest.mark.parametrize("version", ["1.0", "1.8", "1.99"])
def test_check_version_accepts_same_major(version):
    assert protocol.check_version({"v": version}) == (1, int(version.split(".")[1]))


@pytest.mark.parametrize("message,expected", [
    ({"v": "2.0"}, "major differs"),
    ({"v": "0.9"}, "major differs"),
    ({"v": "x"}, "MAJOR.MINOR"),
    ({"v": "1"}, "MAJOR.MINOR"),
    ({"v": "1.x"}, "MAJOR.MINOR"),
    ({"v": 1.0}, "lacks a protocol version"),
    ({}, "lacks a protocol version"),
])
def test_check_version_refuses(message, expected):
    with pytest.raises(ProtocolError, match=expected):
        protocol.check_version(message)


def test_request_builder_is_parsed_back():
    message = protocol.request("heartbeat", 42, {"client_id": "c1-1"})
    assert message["v"] == protocol.VERSION_STRING == "1.10"
    assert protocol.parse_request(protocol.unpack(protocol.pack(message))) == (42, "heartbeat", {"client_id": "c1-1"})
    assert protocol.parse_request({"v": "1.3", "id": "s", "op": "status"}) == ("s", "status", {})  # args optional


@pytest.mark.parametrize("message,expected", [
    ({"v": "1.0", "id": True, "op": "status"}, "'id'"),
    ({"v": "1.0", "id": [1], "op": "status"}, "'id'"),
    ({"v": "1.0", "id": None, "op": "status"}, "'id'"),
    ({"v": "1.0", "id": 1.5, "op": "status"}, "'id'"),
    ({"v": "1.0", "id": 1, "op": "format_disk"}, "unknown operation 'format_disk'"),
    ({"v": "1.0", "id": 1, "op": 3}, "'op' must be a string"),
    ({"v": "1.0", "id": 1}, "'op' must be a string"),
    ({"v": "1.0", "id": 1, "op": "status", "args": [1]}, "'args' must be a map, got list"),
    ({"v": "1.0", "id": 1, "op": "status", "args": "x"}, "'args' must be a map, got str"),
    ({"v": "2.0", "id": 1, "op": "status"}, "major differs"),
])
def test_parse_request_refuses(message, expected):
    with pytest.raises(ProtocolError, match=expected):
        protocol.parse_request(message)


def test_replies_keep_envelope_and_payload_apart():
    ok = protocol.ok_reply(7, {"ok": False, "error": "sneaky"})
    assert ok["ok"] is True and "error" not in ok and ok["result"] == {"ok": False, "error": "sneaky"}
    err = protocol.error_reply(None, "not_ready", "NotReadyError", "no table")
    assert err["ok"] is False and err["id"] is None
    assert err["error"] == {"code": "not_ready", "name": "NotReadyError", "message": "no table"}
    event = protocol.state_event("ready", 1, "abc")
    protocol.check_version(event)
    assert event["event"] == "state" and event["state"] == "ready"


# -- endpoints ---------------------------------------------------------------------------
def test_default_endpoint_prefers_engramd_socket(monkeypatch, tmp_path):
    monkeypatch.setenv("ENGRAMD_SOCKET", "ipc:///somewhere/else.sock")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert endpoints.default_endpoint() == "ipc:///somewhere/else.sock"


def test_default_endpoint_then_xdg_runtime_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("ENGRAMD_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert endpoints.default_endpoint() == f"ipc://{tmp_path}/engramd/engramd.sock"
    monkeypatch.setenv("ENGRAMD_SOCKET", "")  # set but empty counts as unset
    assert endpoints.default_endpoint() == f"ipc://{tmp_path}/engramd/engramd.sock"


def test_default_endpoint_then_a_per_user_tmp_path(monkeypatch):
    monkeypatch.delenv("ENGRAMD_SOCKET", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    expected = os.path.join(tempfile.gettempdir(), f"engramd-{os.getuid()}", "engramd.sock")
    assert endpoints.default_endpoint() == "ipc://" + expected


def test_pub_endpoint_for_ipc_and_tcp():
    assert endpoints.pub_endpoint_for("ipc:///run/engramd/engramd.sock") == "ipc:///run/engramd/engramd.sock.events"
    assert endpoints.pub_endpoint_for("tcp://127.0.0.1:5555") == "tcp://127.0.0.1:5556"
    assert endpoints.pub_endpoint_for("tcp://[::1]:7000") == "tcp://[::1]:7001"
    for endpoint in ("tcp://127.0.0.1", "tcp://host:port", "inproc://x", "/plain/path.sock"):
        with pytest.raises(ProtocolError, match="events endpoint"):
            endpoints.pub_endpoint_for(endpoint)
    assert endpoints.ipc_path("ipc:///a/b.sock") == "/a/b.sock" and endpoints.ipc_path("tcp://h:1") is None


# -- daemon-side handlers, no sockets ------------------------------------------------------
def make_daemon(shm: str, **kwargs) -> Daemon:
    # The endpoint only names the daemon's files; nothing binds it here.
    return Daemon(ServeConfig(shm_dir=shm, endpoint="ipc:///tmp/x-unit.sock", **kwargs))


@pytest.fixture
def loading_daemon(tmp_path):
    daemon = make_daemon(str(tmp_path))  # never started: state stays 'loading'
    yield daemon
    daemon.shm.close()


def test_operations_table_covers_the_protocol():
    assert set(OPERATIONS) == set(protocol.OPERATIONS)
    assert all(op.name == name for name, op in OPERATIONS.items())


def test_attach_while_loading_is_not_ready(loading_daemon):
    assert loading_daemon.state == LOADING
    with pytest.raises(NotReadyError, match="state is loading"):
        OPERATIONS["attach"].execute(loading_daemon, {"pid": os.getpid(), "host": "h", "rank": 0, "device": "cpu"})
    assert loading_daemon.status()["clients"] == []


def test_status_while_loading(loading_daemon):
    status = OPERATIONS["status"].execute(loading_daemon, {})
    assert status["state"] == "loading" and status["table_path"] is None and status["error"] is None
    assert status["checkpoint"] == "<demo>" and status["clients"] == [] and status["layers"] == []
    assert status["pid"] == os.getpid() and status["boot_id"] == loading_daemon.boot_id
    assert status["events_endpoint"] == "ipc:///tmp/x-unit.sock.events"


@pytest.mark.parametrize("op", ["heartbeat", "detach"])
def test_unknown_client(loading_daemon, op):
    with pytest.raises(UnknownClientError, match="nobody"):
        OPERATIONS[op].execute(loading_daemon, {"client_id": "nobody"})


@pytest.mark.parametrize("op,args,expected", [
    ("attach", {}, "'pid' is required"),
    ("attach", {"pid": "1"}, "'pid' must be int, got str"),
    ("attach", {"pid": True}, "'pid' must be .* got a bool"),
    ("attach", {"pid": 0}, "'pid' must be positive"),
    ("attach", {"pid": -5}, "'pid' must be positive"),
    ("attach", {"pid": 1, "rank": "0"}, "'rank'"),
    ("attach", {"pid": 1, "rank": False}, "'rank' .* bool"),
    ("attach", {"pid": 1, "host": 7}, "'host' must be str"),
    ("attach", {"pid": 1, "device": "c" * 65}, "'device' is longer than 64"),
    ("attach", {"pid": 1, "host": "h" * 256}, "'host' is longer than 255"),
    ("heartbeat", {}, "'client_id' is required"),
    ("heartbeat", {"client_id": 7}, "'client_id' must be str, got int"),
    ("detach", {"client_id": None}, "'client_id' must be str, got NoneType"),
    ("detach", {"client_id": ["c1"]}, "'client_id' must be str, got list"),
])
def test_bad_arguments_name_the_argument(loading_daemon, op, args, expected):
    with pytest.raises(ProtocolError, match=expected):
        OPERATIONS[op].execute(loading_daemon, args)


def test_handlers_on_a_loaded_table(tmp_path):
    daemon = make_daemon(str(tmp_path), demo_vocab_size=50)
    try:
        daemon.start_load()
        deadline = time.monotonic() + 30
        while daemon.state == LOADING and time.monotonic() < deadline:
            time.sleep(0.01)
        assert daemon.state == READY, f"demo load did not finish: state {daemon.state}, error {daemon.current.error}"
        attach = OPERATIONS["attach"].execute(daemon, {"pid": os.getpid(), "rank": 3, "device": "cpu"})
        assert attach["boot_id"] == daemon.boot_id and attach["generation"] == 1
        assert os.path.dirname(attach["table_path"]) == str(tmp_path) and os.path.exists(attach["table_path"])
        assert attach["fingerprint"] == "demo-v50-s0" and attach["lease_seconds"] == 10.0
        client_id, secret = attach["client_id"], attach["lease_secret"]
        with pytest.raises(UnknownClientError):  # the public id alone is not enough
            OPERATIONS["heartbeat"].execute(daemon, {"client_id": client_id})
        beat = OPERATIONS["heartbeat"].execute(daemon, {"client_id": client_id, "secret": secret})
        assert beat == {"boot_id": daemon.boot_id, "generation": 1, "lease_generation": 1, "lease_seconds": 10.0}
        clients = OPERATIONS["status"].execute(daemon, {})["clients"]
        assert [(c["id"], c["rank"], c["pid"]) for c in clients] == [(client_id, 3, os.getpid())]
        with pytest.raises(UnknownClientError):
            OPERATIONS["detach"].execute(daemon, {"client_id": client_id})
        assert OPERATIONS["detach"].execute(daemon, {"client_id": client_id, "secret": secret}) == \
            {"detached": client_id}
        with pytest.raises(UnknownClientError):
            OPERATIONS["detach"].execute(daemon, {"client_id": client_id, "secret": secret})
        assert OPERATIONS["stop"].execute(daemon, {}) == {"stopping": True, "boot_id": daemon.boot_id}
        assert daemon.stop_requested.is_set()
        daemon.shutdown()
        assert daemon.state == STOPPING and not os.path.exists(attach["table_path"])
    finally:
        daemon.shm.close()
    assert os.listdir(tmp_path) == [], "the daemon left files in its shm dir"


# -- progress ----------------------------------------------------------------------------
def test_progress_render():
    gib, mib = 2**30, 2**20
    assert render(0, 2 * gib) == "loading [" + "." * 30 + "]   0.0% 0.00/2.00 GiB"
    assert render(gib, 2 * gib) == "loading [" + "#" * 15 + "." * 15 + "]  50.0% 1.00/2.00 GiB"
    assert render(2 * gib, 2 * gib) == "loading [" + "#" * 30 + "] 100.0% 2.00/2.00 GiB"
    assert render(0, 0) == "loading [" + "." * 30 + "]   0.0% 0/0 bytes"  # no division by zero
    assert render(1, 2, width=4) == "loading [##..]  50.0% 1/2 bytes"
    # below 0.01 GiB the unit is MiB, so a small table never reads "0.00/0.01 GiB"
    assert render(12 * mib, 38 * mib, width=4) == "loading [#...]  31.6% 12.0/38.0 MiB"