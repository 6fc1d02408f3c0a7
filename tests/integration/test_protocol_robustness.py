"""Bad requests over a real ZeroMQ socket: each gets an error reply or is dropped; the daemon goes on."""
from __future__ import annotations

import msgpack
import pytest
import zmq

from engram_client.core import protocol


@pytest.fixture
def raw(demo_daemon):
    context = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(demo_daemon.endpoint)
    yield sock
    sock.close()


def roundtrip(sock, frames, timeout_ms=3000):
    sock.send_multipart(frames)
    assert sock.poll(timeout_ms), "no reply"
    return msgpack.unpackb(sock.recv_multipart()[-1], raw=False)


BAD_PAYLOADS = [
    (b"\xc1\xff\x00garbage", "not valid msgpack"),
    (msgpack.packb([1, 2, 3]), "must be a map"),
    (msgpack.packb({"id": 1, "op": "status", "args": {}}), "protocol version"),
    (msgpack.packb({"v": "2.0", "id": 1, "op": "status", "args": {}}), "major differs"),
    (msgpack.packb({"v": "one", "id": 1, "op": "status", "args": {}}), "MAJOR.MINOR"),
    (msgpack.packb({"v": "1.0", "id": 1, "op": "format_disk", "args": {}}), "unknown operation"),
    (msgpack.packb({"v": "1.0", "id": 1, "op": "status", "args": [1]}), "must be a map"),
    (msgpack.packb({"v": "1.0", "id": [1], "op": "status"}), "'id'"),
    (msgpack.packb({"v": "1.0", "id": 1, "op": "attach", "args": {}}), "'pid' is required"),
    (msgpack.packb({"v": "1.0", "id": 1, "op": "attach", "args": {"pid": "x"}}), "'pid' must be int"),
    (msgpack.packb({"v": "1.0", "id": 1, "op": "attach", "args": {"pid": True}}), "bool"),
    (msgpack.packb({"v": "1.0", "id": 1, "op": "heartbeat", "args": {"client_id": "nobody"}}), "no lease"),
    (msgpack.packb({"v": "1.0", "id": 1, "op": "detach", "args": {"client_id": 7}}), "must be str"),
]


@pytest.mark.parametrize("payload,expected", BAD_PAYLOADS)
def test_bad_request_gets_error_reply_and_daemon_goes_on(raw, demo_daemon, payload, expected):
    reply = roundtrip(raw, [payload])
    assert reply["ok"] is False
    assert expected in reply["error"]["message"]
    assert {"code", "name", "message"} <= set(reply["error"])
    assert demo_daemon.status()["state"] == "ready"


def test_minor_version_above_ours_is_accepted(raw):
    reply = roundtrip(raw, [msgpack.packb({"v": "1.99", "id": "x", "op": "status", "args": {}, "extra": 1})])
    assert reply["ok"] is True and reply["id"] == "x"


def test_extra_frames_get_an_error(raw, demo_daemon):
    reply = roundtrip(raw, [protocol.pack(protocol.request("status", 1)), b"extra"])
    assert reply["ok"] is False and "exactly one payload frame" in reply["error"]["message"]


def test_req_framing_is_answered(demo_daemon):
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(demo_daemon.endpoint)
    try:
        sock.send(protocol.pack(protocol.request("status", 9)))
        assert sock.poll(3000)
        reply = protocol.unpack(sock.recv())
        assert reply["ok"] and reply["id"] == 9 and reply["result"]["state"] == "ready"
    finally:
        sock.close()


def test_oversized_message_is_dropped_and_daemon_goes_on(raw, demo_daemon):
    raw.send(b"\x00" * (protocol.MAX_REQUEST_BYTES * 4))
    assert not raw.poll(500), "an oversized message must not be answered"
    assert demo_daemon.status()["state"] == "ready"


def test_many_connections_at_once(demo_daemon):
    context = zmq.Context.instance()
    socks = [context.socket(zmq.DEALER) for _ in range(50)]
    try:
        for i, sock in enumerate(socks):
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(demo_daemon.endpoint)
            sock.send(protocol.pack(protocol.request("status", i)))
        for i, sock in enumerate(socks):
            assert sock.poll(5000), f"connection {i} got no reply"
            assert protocol.unpack(sock.recv())["id"] == i
    finally:
        for sock in socks:
            sock.close()


def test_events_are_published_on_state_change(daemon_factory):
    daemon = daemon_factory("--max-load-rate", "5")
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    status = daemon.wait_state("loading", "ready")
    sub.connect(status["events_endpoint"])
    try:
        daemon.wait_state("ready")
        daemon.connection.request("stop")
        states = []
        while sub.poll(3000):
            event = protocol.unpack(sub.recv())
            states.append(event["state"])
            assert event["boot_id"] == status["boot_id"]
            if event["state"] == "stopping":
                break
        assert "stopping" in states
    finally:
        sub.close()
