"""The daemon's ZMTP codec: greetings it refuses, frames it refuses before buffering them, and the
byte count it keeps of what it holds."""
from __future__ import annotations

import pytest

from engram_client.core.errors import ProtocolError
from engramd.wire import zmtp
from engramd.wire.peer import Peer

LIBZMQ_GREETING = b"\xff" + bytes(7) + b"\x01\x7f\x03\x01" + b"NULL".ljust(20, b"\0") + bytes(32)  # as libzmq 4.3 sends it


def test_our_greeting_is_64_bytes_of_zmtp_3_0_null():
    assert len(zmtp.OUR_GREETING) == 64 and zmtp.OUR_GREETING[10:12] == b"\x03\x00"
    assert zmtp.check_greeting(zmtp.OUR_GREETING) and zmtp.check_greeting(LIBZMQ_GREETING)


@pytest.mark.parametrize("data,says", [
    (b"GET / HTTP/1.1\r\n", "not a ZMTP 3 greeting"),
    (b"\xff" + bytes(8) + b"\x7f\x01", "ZMTP 1.x peer"),  # a ZMTP 2.0 peer's revision byte
    (LIBZMQ_GREETING[:12] + b"CURVE".ljust(20, b"\0") + bytes(32), "mechanism b'CURVE'"),
])
def test_greetings_that_are_refused(data, says):
    with pytest.raises(ProtocolError, match=says.replace("(", r"\(")):
        zmtp.check_greeting(data)


def test_a_partial_greeting_waits_and_a_bad_first_byte_fails_at_once():
    assert zmtp.check_greeting(LIBZMQ_GREETING[:10]) is False
    with pytest.raises(ProtocolError):
        zmtp.check_greeting(b"\x16")  # a TLS hello


def test_an_oversized_frame_is_refused_from_its_header_alone():
    reader = zmtp.FrameReader(1024, zmtp.Tally())
    reader.feed(bytes([zmtp.LONG | zmtp.MORE]) + (1 << 30).to_bytes(8, "big"))  # announces 1 GiB, sends none of it
    with pytest.raises(ProtocolError, match="1073741824 bytes"):
        reader.next()


def test_frames_split_anywhere_come_out_whole_and_the_tally_returns_to_zero():
    tally = zmtp.Tally()
    reader = zmtp.FrameReader(4096, tally)
    wire = b"".join(zmtp.encode([b"", b"a" * 300, b"b"]))
    frames = []
    for byte in wire:
        reader.feed(bytes([byte]))
        while (frame := reader.next()) is not None:
            frames.append(frame)
    assert frames == [(zmtp.MORE, b""), (zmtp.MORE | zmtp.LONG, b"a" * 300), (0, b"b")]
    assert tally.bytes == 0 and reader.unparsed == 0


def test_reserved_flag_bits_are_refused():
    reader = zmtp.FrameReader(64, zmtp.Tally())
    reader.feed(b"\x80\x00")
    with pytest.raises(ProtocolError, match="reserved"):
        reader.next()


def test_a_message_past_its_frame_bound_is_refused_before_it_ends():
    peer = Peer(b"id", None, None, 0, 64, zmtp.Tally())
    peer.reader.feed(b"".join(zmtp.header(zmtp.MORE, 1) + b"x" for _ in range(9)))
    with pytest.raises(ProtocolError, match="more than 8 frames"):
        peer.next_item(8, 1024)


def test_ready_round_trips_and_commands_parse():
    name, data = zmtp.parse_command(zmtp.ready(b"ROUTER")[2:])
    assert name == b"READY" and zmtp.parse_properties(data) == {b"Socket-Type": b"ROUTER", b"Identity": b""}
    with pytest.raises(ProtocolError, match="run past"):
        zmtp.parse_properties(b"\x0bSocket-Type\x00\x00\x10\x00DEALER")
