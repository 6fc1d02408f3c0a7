"""A real engramd's ROUTER under hypothesis, over real ZeroMQ DEALER sockets.

What docs/protocol.md promises, checked for whatever arrives: random bytes, msgpack
of the wrong type, maps with random keys and values, requests with random ``v``,
``id``, ``op`` and ``args``, truncated requests, extra and empty frames, REQ-style
framing; frames over 64 KiB are dropped by the socket with no reply.

    - a message of more than 64 KiB (its frames together) or of more than 8 frames gets no
      reply: the daemon closes that connection (docs/protocol.md);
    - every other message gets exactly one reply, framed like the request;
    - a refused one has ok=false and error {code, name, message}, the code one of the
      documented ones and never ``internal`` (that would be a bug in the daemon);
    - the id is echoed when it is an int or a string, else null;
    - after every example the daemon still answers a real ``status`` (through
      engram_client's DaemonConnection): state ready, the same boot_id.

"Exactly one" is checked without sleeping: each example's frames are followed on the
same socket by a status probe with a fresh id, and replies on one connection come back
in order, so everything before the probe's reply belongs to the example.

Ops that change the daemon (``stop``, ``reload``) are never sent.  Versions made of
non-ASCII digits have a targeted test (test_version_with_non_ascii_digits_is_a_bad_request)
and are kept out of the code check of the property tests (``version_bug``).
"""
from __future__ import annotations

import itertools
import os
import random
import shutil
import tempfile
import time

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import note as hypothesis_note
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from conftest import DaemonProcess
from engram_client.core import protocol
from engramd.wire.bounds import MAX_FRAMES

FUZZ = settings(max_examples=400, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.filter_too_much])
CODES = {"bad_request": "ProtocolError", "not_ready": "NotReadyError", "unknown_client": "UnknownClientError"}
MUTATING_OPS = {"stop", "reload"}
MAX = protocol.MAX_REQUEST_BYTES
REPLY_TIMEOUT_S = 10.0
BOMB = (b"\xdd\x00\x00\xea\x00" * 1000).ljust(MAX, b"\x00")  # a thousand nested 60,000-slot arrays, 64 KiB


# --- a model of what the daemon must do -----------------------------------------------

def note(text: str) -> None:
    """hypothesis.note where there is an example to attach it to (the plain tests share these helpers)."""
    try:
        hypothesis_note(text)
    except InvalidArgument:
        pass


def over_the_bounds(frames: list[bytes]) -> bool:
    """A message the daemon answers by closing the connection, not with a reply."""
    return len(frames) > MAX_FRAMES or sum(map(len, frames)) > MAX


def framing(frames: list[bytes]) -> tuple[int, list[bytes]]:
    """(frames before the payload in the reply, payload frames), as the server splits a DEALER's frames."""
    if frames[0] == b"" and len(frames) >= 2:
        return 1, frames[1:]
    return 0, frames


def decoded(frames: list[bytes]):
    """The request map the daemon will see, or None if it cannot see one."""
    _, body = framing(frames)
    if len(body) != 1 or len(body[0]) > MAX:
        return None
    try:
        message = msgpack.unpackb(body[0], raw=False, strict_map_key=True)
    except Exception:
        return None
    return message if isinstance(message, dict) else None


def mutating(frames: list[bytes]) -> bool:
    message = decoded(frames)
    return message is not None and isinstance(message.get("op"), str) and message["op"] in MUTATING_OPS


def version_bug(version) -> bool:
    """Versions that str.isdigit() accepts but int() cannot parse: the known bug."""
    if not isinstance(version, str):
        return False
    major, _, minor = version.partition(".")
    return major.isdigit() and minor.isdigit() and (not major.isdecimal() or len(major) > 4000)


def expectation(frames: list[bytes]) -> str:
    """'error' (must be refused), 'ok' (must be served), 'either' (depends on the daemon's leases),
    'unspecified' (only well-formedness is checked)."""
    _, body = framing(frames)
    message = decoded(frames)
    if len(body) != 1 or message is None:
        return "error"
    version = message.get("v")
    if not isinstance(version, str):
        return "error"
    major, _, minor = version.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        return "error"
    if not (major.isascii() and minor.isascii()):
        return "unspecified"  # non-ASCII digits: see version_bug
    if int(major) != protocol.PROTOCOL_VERSION[0]:
        return "error"
    request_id, op, args = message.get("id"), message.get("op"), message.get("args", {})
    if not isinstance(request_id, (int, str)) or isinstance(request_id, bool):
        return "error"
    if not isinstance(op, str) or op not in protocol.OPERATIONS or not isinstance(args, dict):
        return "error"
    return "ok" if op == "status" else "either"


def check_reply(frames: list[bytes], replies: list[list[bytes]]) -> None:
    assert len(replies) == 1, f"expected exactly one reply, got {len(replies)}: {replies!r:.500}"
    envelope, _ = framing(frames)
    reply_frames = replies[0]
    assert len(reply_frames) == envelope + 1, f"reply framing {reply_frames!r:.200} does not mirror the request's"
    assert reply_frames[:envelope] == [b""] * envelope
    reply = msgpack.unpackb(reply_frames[-1], raw=False)
    assert isinstance(reply, dict) and reply.get("v") == protocol.VERSION_STRING, reply
    message = decoded(frames)
    request_id = message.get("id") if message is not None else None
    assert reply["id"] == (request_id if isinstance(request_id, (int, str)) else None), (reply["id"], request_id)
    outcome = expectation(frames)
    note(f"expected {outcome}, reply {reply!r:.300}")
    if reply["ok"] is False:
        error = reply["error"]
        assert "result" not in reply
        assert isinstance(error, dict) and {"code", "name", "message"} <= set(error), error
        assert all(isinstance(error[key], str) for key in ("code", "name", "message")), error
        assert error["message"], "an error must say what was wrong"
        if outcome == "ok":
            raise AssertionError(f"a valid status request was refused: {error}")
        if outcome != "unspecified" and not version_bug(message.get("v") if message else None):
            assert error["code"] in CODES, f"not a documented refusal (a bug in the daemon?): {error}"
            assert error["name"] == CODES[error["code"]], error
    else:
        assert reply["ok"] is True and isinstance(reply.get("result"), dict) and "error" not in reply, reply
        assert outcome in ("ok", "either", "unspecified"), f"a bad request was served: {reply!r:.300}"


# --- the wire -------------------------------------------------------------------------

class Wire:
    """DEALER sockets to one daemon; every wait bounded."""

    def __init__(self, daemon):
        self.daemon = daemon
        self.context = zmq.Context.instance()
        self.boot_id = daemon.status()["boot_id"]
        self.probes = itertools.count()
        self.sockets: list[zmq.Socket] = []
        self.sock = self.dealer()

    def dealer(self, **options) -> zmq.Socket:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        for name, value in options.items():
            sock.setsockopt(getattr(zmq, name), value)
        sock.connect(self.daemon.endpoint)
        self.sockets.append(sock)
        return sock

    def probe_request(self) -> tuple[str, bytes]:
        probe_id = f"probe-{next(self.probes)}-{self.boot_id}"
        return probe_id, protocol.pack(protocol.request("status", probe_id))

    def check_probe(self, frames: list[bytes], probe_id: str) -> bool:
        """True if ``frames`` is the answer to status probe ``probe_id`` (asserting it is a good one)."""
        if len(frames) != 1:
            return False
        try:
            reply = msgpack.unpackb(frames[0], raw=False)
        except Exception:
            return False
        if not isinstance(reply, dict) or reply.get("id") != probe_id:
            return False
        assert reply["ok"] is True, reply
        assert reply["result"]["state"] == "ready" and reply["result"]["boot_id"] == self.boot_id, reply["result"]
        return True

    def exchange(self, frames: list[bytes], sock: zmq.Socket | None = None) -> list[list[bytes]]:
        """Send ``frames`` then a status probe; return every reply that came before the probe's."""
        sock = sock or self.sock
        probe_id, probe = self.probe_request()
        sock.send_multipart(frames)
        sock.send(probe)
        replies, deadline = [], time.monotonic() + REPLY_TIMEOUT_S
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0 and sock.poll(int(remaining * 1000) + 1), \
                f"no answer to a status probe within {REPLY_TIMEOUT_S} s after {frames!r:.300}"
            got = sock.recv_multipart()
            if self.check_probe(got, probe_id):
                return replies
            replies.append(got)

    def assert_cut(self, frames: list[bytes]) -> None:
        """Send ``frames`` on a connection of their own: the daemon must close it without a reply."""
        sock = self.dealer()
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            sock.send_multipart(frames)
            assert monitor.poll(int(REPLY_TIMEOUT_S * 1000)), \
                f"the daemon did not close a connection within {REPLY_TIMEOUT_S} s after {frames!r:.300}"
            assert not sock.poll(0), f"a message over the bounds was answered: {frames!r:.300}"
        finally:
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close(linger=0)
            self.sockets.remove(sock)

    def assert_alive(self) -> None:
        """A real client's status request: ready, same boot."""
        status = self.daemon.status(timeout=REPLY_TIMEOUT_S)
        assert status["state"] == "ready" and status["boot_id"] == self.boot_id, status
        assert self.daemon.proc.poll() is None, "the daemon exited"

    def close(self) -> None:
        for sock in self.sockets:
            sock.close(linger=0)


@pytest.fixture(scope="module")
def fuzzed_daemon():
    """One demo daemon for the module's tests (a daemon start each cost a second): none of them stops or
    reloads it (MUTATING_OPS are never sent), and each checks that it still answers as the boot it met
    first.  The memory test has a daemon of its own (its VmHWM starts fresh)."""
    socket_dir = tempfile.mkdtemp(prefix="engt-")
    shm_dir = tempfile.mkdtemp(prefix="engt-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    daemon = DaemonProcess(socket_dir, shm_dir, "--lease-seconds", "1.5").start()
    try:
        daemon.wait_state("ready")
        yield daemon
    finally:
        daemon.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)
        shutil.rmtree(shm_dir, ignore_errors=True)


def wire_to(daemon):
    w = Wire(daemon)
    yield w
    w.close()
    assert daemon.proc.poll() is None, f"the daemon died:\n{daemon.log()[-3000:]}"


@pytest.fixture
def wire(fuzzed_daemon):
    yield from wire_to(fuzzed_daemon)


@pytest.fixture
def fresh_wire(demo_daemon):
    yield from wire_to(demo_daemon)


def fuzz_one(wire: Wire, frames: list[bytes]) -> None:
    note(f"frames {frames!r:.1000}")
    if over_the_bounds(frames):
        wire.assert_cut(frames)
    else:
        check_reply(frames, wire.exchange(frames))
    wire.assert_alive()


# --- strategies -------------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=16)
           | st.binary(max_size=16))
values = st.recursive(scalars, lambda children: st.lists(children, max_size=4)
                      | st.dictionaries(st.text(max_size=8), children, max_size=4), max_leaves=12)
keys = st.sampled_from(["v", "id", "op", "args"]) | st.text(max_size=8) | st.integers(-5, 5) | st.binary(max_size=4)
versions = (st.sampled_from(["1.0", "1.0", "1.99", "2.0", "0.9", "1", "1.", ".0", "01.0", "1.0.0", " 1.0", "1.0\x00",
                             "１.0", "².0", "١.٠", "-1.0", "+1.0", "1.-0", "1_0.0"])
            | st.from_regex(r"\A[0-9]{1,5}\.[0-9]{0,5}\Z") | st.text(max_size=8) | values)
known_ops = sorted(set(protocol.OPERATIONS) - MUTATING_OPS)
ops = (st.sampled_from(known_ops + ["format_disk", "", "STATUS", "status\x00", " status", "__init__", "execute"])
       | st.text(max_size=12) | values).filter(lambda op: not (isinstance(op, str) and op in MUTATING_OPS))
arg_names = st.sampled_from(["pid", "host", "rank", "device", "client_id"]) | st.text(max_size=8)
arg_values = (values | st.integers(-5, 2**31) | st.text(max_size=300) | st.sampled_from([0, -1, 1, 2**63, True])
              | st.sampled_from(["c1-1", "cpu", "cuda:0", ""]))
args = st.dictionaries(arg_names, arg_values, max_size=5) | values
ids = st.integers(-2**63, 2**64 - 1) | st.text(max_size=16) | values


@st.composite
def requests(draw) -> dict:
    """A request map with some fields valid and some random or missing."""
    message = {}
    for key, strategy, valid in (("v", versions, "1.0"), ("id", ids, 1), ("op", ops, "status"), ("args", args, {})):
        choice = draw(st.sampled_from(["valid", "random", "random", "missing"]))
        if choice == "valid":
            message[key] = valid
        elif choice == "random":
            message[key] = draw(strategy)
    if draw(st.booleans()):
        message[draw(st.text(max_size=6))] = draw(values)
    return message


def packed(strategy):
    return strategy.map(lambda value: msgpack.packb(value, use_bin_type=True))


wrong_types = packed(values.filter(lambda value: not isinstance(value, dict)))
random_maps = packed(st.dictionaries(keys, values, max_size=6))
request_payloads = packed(requests())
pathological = st.sampled_from([
    b"", b"\xc1", b"\x80", b"\x90", b"\xc0", b"\xdf\xff\xff\xff\xff", b"\xdd\xff\xff\xff\xff",
    b"\xdb\xff\xff\xff\xff" + b"x" * 100, b"\xc6\xff\xff\xff\xff", b"\x91" * 5000 + b"\xc0",
    BOMB,
    msgpack.packb(msgpack.ExtType(5, b"x")), msgpack.packb({"v": msgpack.Timestamp(0, 0), "id": 1}), b"\xd6\xff\x00\x00\x00",
    msgpack.packb({"v": "1.0", "id": 1, "op": "status", "args": {}}) + b"trailing",
    msgpack.packb({"v": "1.0", "id": 1, "op": "status"}) * 2,
    b"\x84\xa1v\xa31.0\xa2id\x01\xa2op\xa6status\xa4args\x80"[:-1],
    "{\"v\": \"1.0\"}".encode(),
])


@st.composite
def truncated(draw) -> bytes:
    whole = msgpack.packb(draw(requests() | st.just({"v": "1.0", "id": 7, "op": "status", "args": {}})),
                          use_bin_type=True)
    return whole[:draw(st.integers(0, len(whole) - 1))]


payloads = st.binary(max_size=512) | wrong_types | random_maps | request_payloads | truncated() | pathological
single = payloads.map(lambda payload: [payload])
req_framed = payloads.map(lambda payload: [b"", payload])
multi = st.lists(payloads | st.just(b"") | packed(st.just(protocol.request("status", 5))), min_size=2, max_size=5)
empties = st.integers(1, 5).map(lambda n: [b""] * n)
frame_sets = (single | req_framed | multi | empties).filter(lambda frames: not mutating(frames))


# --- properties -------------------------------------------------------------------------

@FUZZ
@given(payload=st.binary(max_size=2048).filter(lambda p: not mutating([p])))
def test_random_bytes(wire, payload):
    fuzz_one(wire, [payload])


@FUZZ
@given(payload=(wrong_types | random_maps).filter(lambda p: not mutating([p])))
def test_msgpack_of_wrong_types_and_random_maps(wire, payload):
    fuzz_one(wire, [payload])


@FUZZ
@given(payload=request_payloads.filter(lambda p: not mutating([p])))
def test_requests_with_random_fields(wire, payload):
    fuzz_one(wire, [payload])


@FUZZ
@given(payload=truncated().filter(lambda p: not mutating([p])) | pathological)
def test_truncated_and_pathological_msgpack(wire, payload):
    fuzz_one(wire, [payload])


@settings(FUZZ, max_examples=600)
@given(frames=frame_sets)
def test_any_framing(wire, frames):
    fuzz_one(wire, frames)


@settings(FUZZ, max_examples=25)
@given(sizes=st.lists(st.integers(0, MAX) | st.integers(MAX + 1, 4 * MAX), min_size=1, max_size=4)
       .filter(lambda sizes: max(sizes) > MAX), fill=st.binary(min_size=1, max_size=8))
def test_oversized_frames_are_dropped_without_reply(wire, sizes, fill):
    sock = wire.dealer()
    sock.send_multipart([(fill * (size // len(fill) + 1))[:size] for size in sizes])
    wire.assert_alive()
    assert not sock.poll(100), f"a message with a frame over {MAX} bytes was answered"
    sock.close(linger=0)
    wire.sockets.remove(sock)
    check_reply([protocol.pack(protocol.request("status", 1))],
                wire.exchange([protocol.pack(protocol.request("status", 1))]))


def test_frames_over_the_limit_together_are_not_answered(wire):
    """Frames each within 64 KiB but over it together (what test_any_framing draws now and then: a
    nested-array bomb among small frames) close the connection; the next connection is served."""
    for frames in ([b"x" * 9, b"y" * 38, BOMB], [BOMB, b"\xc1"], [b"", BOMB, b"z"]):
        assert over_the_bounds(frames)
        fuzz_one(wire, frames)
    at_the_limit = [BOMB[:MAX // 2], BOMB[MAX // 2:]]  # 64 KiB together: answered, with a bad_request
    assert not over_the_bounds(at_the_limit)
    fuzz_one(wire, at_the_limit)


def padded_status(size: int) -> bytes:
    """A valid status request of exactly ``size`` bytes (the padding goes in an ignored arg)."""
    overhead = len(msgpack.packb(protocol.request("status", "big", {"pad": ""}), use_bin_type=True))
    for pad in range(size - overhead - 5, size - overhead + 1):
        payload = msgpack.packb(protocol.request("status", "big", {"pad": "x" * pad}), use_bin_type=True)
        if len(payload) == size:
            return payload
    raise AssertionError(f"cannot pad a request to {size} bytes")


def test_a_request_of_exactly_the_limit_is_served_one_byte_more_is_dropped(wire):
    at_limit = padded_status(MAX)
    replies = wire.exchange([at_limit])
    check_reply([at_limit], replies)
    assert msgpack.unpackb(replies[0][-1], raw=False)["result"]["state"] == "ready"
    sock = wire.dealer()
    sock.send(padded_status(MAX + 1))
    wire.assert_alive()
    assert not sock.poll(300), "a request one byte over the limit was answered"


def test_routing_id_impostor_cannot_take_a_peers_replies(wire):
    """A second DEALER claiming a connected peer's routing id gets only the reply to its own request;
    the first keeps every one of its replies (the daemon routes by connection, never by a claimed id)."""
    first = wire.dealer(ROUTING_ID=b"rank-7")
    assert len(wire.exchange([protocol.pack(protocol.request("status", 1))], first)) == 1
    impostor = wire.dealer(ROUTING_ID=b"rank-7")
    impostor.send(protocol.pack(protocol.request("status", "stolen")))
    for n in range(5):
        replies = wire.exchange([protocol.pack(protocol.request("heartbeat", n, {"client_id": "x"}))], first)
        assert [protocol.unpack(reply[-1])["id"] for reply in replies] == [n]
    assert impostor.poll(10_000), "the impostor's own request was not answered"
    assert protocol.unpack(impostor.recv())["id"] == "stolen"
    assert not impostor.poll(300), "the impostor got a reply meant for the first peer"
    wire.assert_alive()


@pytest.mark.parametrize("version", ["².0", "9" * 5000 + ".0"], ids=["superscript", "5000-digit-major"])
def test_version_with_non_ascii_digits_is_a_bad_request(wire, version):
    frames = [msgpack.packb({"v": version, "id": 3, "op": "status", "args": {}})]
    replies = wire.exchange(frames)
    assert len(replies) == 1
    reply = msgpack.unpackb(replies[0][-1], raw=False)
    assert reply["ok"] is False and reply["error"]["code"] == "bad_request", reply["error"]


# --- many connections at once -------------------------------------------------------------

def bad_requests(rng: random.Random, n: int) -> list[list[bytes]]:
    kinds = [
        lambda: [rng.randbytes(rng.randint(0, 64))],
        lambda: [msgpack.packb([1, rng.random(), "x"])],
        lambda: [msgpack.packb({"v": "1.0", "id": rng.randint(0, 10**6), "op": "format_disk"})],
        lambda: [msgpack.packb({"v": "9.0", "id": rng.randint(0, 10**6), "op": "status"})],
        lambda: [protocol.pack(protocol.request("status", 1)), b"extra"],
        lambda: [b""],
        lambda: [b"", b"", rng.randbytes(8)],
        lambda: [protocol.pack(protocol.request("heartbeat", rng.randint(0, 10**6), {"client_id": "nobody"}))],
        lambda: [protocol.pack(protocol.request("attach", rng.randint(0, 10**6), {"pid": -rng.randint(0, 9)}))],
    ]
    return [rng.choice(kinds)() for _ in range(n)]


def test_200_connections_with_good_and_bad_requests(wire):
    rng = random.Random(20240601)
    peers, per_peer, good_each = 200, 10, 5
    plans = []
    for peer in range(peers):
        goods = [[protocol.pack(protocol.request("status", f"good-{peer}-{i}"))] for i in range(good_each)]
        plan = goods + bad_requests(rng, per_peer - good_each)
        rng.shuffle(plan)
        plans.append((wire.dealer(), plan))
    flooders = [wire.dealer() for _ in range(10)]  # oversized frames alongside, never answered
    for round_ in range(per_peer):  # interleaved, so every connection has requests in flight at once
        for sock, plan in plans:
            sock.send_multipart(plan[round_])
        flooders[round_].send(b"\x00" * (2 * MAX))
    received = {id(sock): [] for sock, _ in plans}
    poller = zmq.Poller()
    for sock, _ in plans:
        poller.register(sock, zmq.POLLIN)
    deadline = time.monotonic() + 60
    while sum(map(len, received.values())) < peers * per_peer:
        remaining = deadline - time.monotonic()
        assert remaining > 0, (f"only {sum(map(len, received.values()))} of {peers * per_peer} replies "
                               "within 60 s")
        for sock, _ in poller.poll(int(remaining * 1000) + 1):
            while sock.poll(0):
                received[id(sock)].append(sock.recv_multipart())
    time.sleep(0.3)
    good_answered = 0
    for sock, plan in plans:
        while sock.poll(0):
            received[id(sock)].append(sock.recv_multipart())
        replies = received[id(sock)]
        assert len(replies) == per_peer, f"{len(replies)} replies to {per_peer} requests on one connection"
        for frames, reply_frames in zip(plan, replies):  # one connection's replies come in order
            check_reply(frames, [reply_frames])
            reply = msgpack.unpackb(reply_frames[-1], raw=False)
            if isinstance(reply["id"], str) and reply["id"].startswith("good-"):
                assert reply["ok"] and reply["result"]["boot_id"] == wire.boot_id
                good_answered += 1
    assert good_answered == peers * good_each
    for sock in flooders:
        assert not sock.poll(0), "an oversized frame was answered"
    wire.assert_alive()


# --- memory ---------------------------------------------------------------------------------

def vm_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def abuse(wire: Wire, rng: random.Random, answered: int, oversized: int, unanswered: int, bombs: int) -> int:
    """Bad requests of every kind; returns how many were sent."""
    socks = [wire.dealer() for _ in range(4)]
    batch = 250
    for start in range(0, answered, batch):  # answered, and every reply read
        sock = socks[start // batch % len(socks)]
        plan = bad_requests(rng, min(batch, answered - start))
        for frames in plan:
            sock.send_multipart(frames)
        assert len(wire.exchange([b"\xc1"], sock)) == len(plan) + 1
    for _ in range(bombs):
        check_reply([BOMB], wire.exchange([BOMB]))
    for _ in range(oversized):  # dropped by the socket, each on a connection of its own
        sock = wire.dealer()
        sock.send(rng.randbytes(8) * (MAX // 8 + 1 + rng.randint(0, 4 * MAX // 8)))
    for _ in range(unanswered // 100):  # sent, never read; the sender goes away
        sock = wire.dealer(LINGER=2000)
        for frames in bad_requests(rng, 100):
            sock.send_multipart(frames)
        wire.sockets.remove(sock)
        sock.close()
    wire.assert_alive()
    for sock in list(wire.sockets[1:]):
        sock.close(linger=0)
        wire.sockets.remove(sock)
    return answered + oversized + unanswered + bombs


def test_memory_stays_bounded_under_bad_requests(fresh_wire, demo_daemon):
    wire = fresh_wire
    pid, rng = demo_daemon.proc.pid, random.Random(7)
    hwm_fresh = vm_kib(pid, "VmHWM")
    abuse(wire, rng, answered=500, oversized=20, unanswered=200, bombs=2)  # warm up allocators and caches
    time.sleep(0.5)
    before, hwm_before = vm_kib(pid, "VmRSS"), vm_kib(pid, "VmHWM")
    sent = abuse(wire, rng, answered=4000, oversized=200, unanswered=1000, bombs=20)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:  # let the unread senders' requests be handled
        wire.assert_alive()
        time.sleep(0.1)
    after, hwm_after = vm_kib(pid, "VmRSS"), vm_kib(pid, "VmHWM")
    growth_mib = (after - before) / 1024
    print(f"\nengramd pid {pid}: {sent} bad requests (4000 answered, 200 oversized, 1000 never read, 20 "
          f"nested-array bombs); VmRSS {before / 1024:.1f} -> {after / 1024:.1f} MiB ({growth_mib:+.1f} MiB), "
          f"VmHWM {hwm_fresh / 1024:.1f} (fresh) -> {hwm_before / 1024:.1f} (after warm-up with 2 bombs) -> "
          f"{hwm_after / 1024:.1f} MiB")
    assert growth_mib < 64, f"the daemon's RSS grew by {growth_mib:.1f} MiB"
