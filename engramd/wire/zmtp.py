"""ZMTP 3.0 with the NULL mechanism, as much of it as the daemon's end needs (rfc.zeromq.org/spec/23).

    greeting   0xFF, 8 bytes, 0x7F | major 3, minor 0 | "NULL" padded to 20 bytes | as-server | 31 zero bytes
    frame      flags (bit 0 MORE, bit 1 LONG, bit 2 COMMAND) | size: 1 byte, or 8 big-endian if LONG | body
    command    a frame with COMMAND: name length (1 byte) | name | data
    READY      data = properties, each: name length (1 byte) | name | value length (4, big-endian) | value

Each side sends its 64-byte greeting and a READY command naming its socket type; after that a
message is frames, each but the last flagged MORE.  libzmq 4.x peers speak 3.0 or 3.1 and
talk 3.0 to a 3.0 peer; older peers (ZMTP 1.0 and 2.0) and other mechanisms are refused.
Every violation raises ProtocolError naming what was wrong; the caller cuts the peer.
"""
from __future__ import annotations

from engram_client.core.errors import ProtocolError

MORE, LONG, COMMAND = 0x01, 0x02, 0x04
GREETING_BYTES = 64
OUR_GREETING = bytes([0xFF]) + bytes(8) + bytes([0x7F, 3, 0]) + b"NULL".ljust(20, b"\0") + bytes(32)


def check_greeting(data: bytes) -> bool:
    """True once ``data`` holds a whole acceptable greeting; raises as soon as its bytes say it is not one."""
    if data[:1] not in (b"", b"\xff") or (len(data) >= 10 and not data[9] & 1):
        raise ProtocolError("not a ZMTP 3 greeting (not a ZeroMQ peer, or ZMTP 1.0)")
    if len(data) >= 11 and data[10] < 3:
        raise ProtocolError(f"ZMTP {data[10]}.x peer; engramd speaks ZMTP 3 (libzmq 4 or later)")
    if len(data) < GREETING_BYTES:
        return False
    mechanism = data[12:32].rstrip(b"\0")
    if mechanism != b"NULL":
        raise ProtocolError(f"security mechanism {mechanism[:20]!r}; this socket speaks NULL only")
    return True


def header(flags: int, size: int) -> bytes:
    if size < 256:
        return bytes([flags, size])
    return bytes([flags | LONG]) + size.to_bytes(8, "big")


def encode(frames: list[bytes]) -> list[bytes]:
    """A message's frames on the wire, as pieces (headers and bodies) to write in order."""
    pieces = []
    for index, frame in enumerate(frames):
        pieces.append(header(MORE if index < len(frames) - 1 else 0, len(frame)))
        pieces.append(frame)
    return pieces


def command(name: bytes, data: bytes = b"") -> bytes:
    body = bytes([len(name)]) + name + data
    return header(COMMAND, len(body)) + body


def ready(socket_type: bytes) -> bytes:
    """Our READY: the socket type we play (a ROUTER also names its own, empty, identity as libzmq's does)."""
    properties = [(b"Socket-Type", socket_type)] + ([(b"Identity", b"")] if socket_type == b"ROUTER" else [])
    return command(b"READY", b"".join(bytes([len(k)]) + k + len(v).to_bytes(4, "big") + v for k, v in properties))


def parse_command(body: bytes) -> tuple[bytes, bytes]:
    """A command frame's body -> (name, data)."""
    if not body or len(body) < 1 + body[0]:
        raise ProtocolError("a command frame too short for its name")
    return body[1:1 + body[0]], body[1 + body[0]:]


def parse_properties(data: bytes) -> dict[bytes, bytes]:
    properties, at = {}, 0
    while at < len(data):
        name_end = at + 1 + data[at]
        value_end = name_end + 4 + int.from_bytes(data[name_end:name_end + 4], "big")
        if name_end + 4 > len(data) or value_end > len(data):
            raise ProtocolError("a READY command whose properties run past its end")
        properties[data[at + 1:name_end]] = data[name_end + 4:value_end]
        at = value_end
    return properties


class Tally:
    """Bytes held unparsed by several readers together."""

    def __init__(self) -> None:
        self.bytes = 0


class FrameReader:
    """Frames out of a byte stream as it arrives, refusing any larger than ``max_frame``
    as soon as its header is in (so a big frame is never buffered).  ``tally`` counts
    the bytes it holds unparsed, with those of other readers."""

    def __init__(self, max_frame: int, tally: Tally):
        self.max_frame = max_frame
        self.tally = tally
        self._buffer = bytearray()
        self._at = 0

    def feed(self, data: bytes) -> None:
        if self._at and self._at * 2 >= len(self._buffer):
            del self._buffer[:self._at]  # drop what was parsed, not on every frame (that would copy the rest each time)
            self._at = 0
        self._buffer += data
        self.tally.bytes += len(data)

    def discard(self) -> None:
        """Drop everything held (the peer is cut)."""
        self.tally.bytes -= self.unparsed
        self._buffer, self._at = bytearray(), 0

    def take(self, size: int) -> bytes:
        """``size`` raw bytes (the greeting), or fewer if not all are in."""
        data = bytes(self._buffer[self._at:self._at + size])
        self._at += len(data)
        self.tally.bytes -= len(data)
        return data

    def peek(self, size: int) -> bytes:
        return bytes(self._buffer[self._at:self._at + size])

    @property
    def unparsed(self) -> int:
        return len(self._buffer) - self._at

    def next(self) -> tuple[int, bytes] | None:
        """The next whole frame as (flags, body), or None until more bytes arrive."""
        buffer, at = self._buffer, self._at
        available = len(buffer) - at
        if available < 2:
            return None
        flags = buffer[at]
        if flags & ~(MORE | LONG | COMMAND):
            raise ProtocolError(f"frame flags {flags:#04x} (reserved bits set)")
        if flags & LONG:
            if available < 9:
                return None
            size, start = int.from_bytes(buffer[at + 1:at + 9], "big"), at + 9
        else:
            size, start = buffer[at + 1], at + 2
        if size > self.max_frame:
            raise ProtocolError(f"a frame of {size} bytes, more than the {self.max_frame} this socket takes")
        if len(buffer) < start + size:
            return None
        self._at = start + size
        self.tally.bytes -= self._at - at
        return flags, bytes(buffer[start:start + size])
