"""One connection on a STREAM socket: where its handshake stands, its input, its output, who it is.

    greeting ──▶ handshake ──▶ open ──▶ closing ──▶ (gone: libzmq told us it disconnected)
       │             │                     ▲
       └─────────────┴─────────────────────┘  a broken rule or a bound, at any step

Input is kept raw (FrameReader) until the endpoint takes a message out of it; output is a
queue of byte pieces handed to libzmq as fast as the peer reads.  A closing peer's input is
dropped as it arrives and nothing more is sent to it.
"""
from __future__ import annotations

import collections
import time

from engram_client.core.errors import ProtocolError

from .zmtp import COMMAND, MORE, FrameReader, Tally, parse_command

GREETING, HANDSHAKE, OPEN, CLOSING = "greeting", "handshake", "open", "closing"


def credentials(peer_address: str | None) -> tuple[int | None, int | None]:
    """(pid, uid) of an ipc peer from libzmq's Peer-Address, ``HOST:UID:GID:PID`` (SO_PEERCRED); None where the
    kernel did not say (pid 0: the peer lives in a pid namespace the daemon cannot see)."""
    parts = (peer_address or "").rsplit(":", 3)
    try:
        uid, pid = int(parts[1]), int(parts[3])
    except (IndexError, ValueError):
        return None, None
    return (pid or None), uid


class Peer:
    def __init__(self, identity: bytes, peer_address: str | None, max_frame: int, tally: Tally):
        self.identity = identity
        self.pid, self.uid = credentials(peer_address)
        self.state = GREETING
        self.connected_at = time.monotonic()
        self.reader: FrameReader | None = FrameReader(max_frame, tally)
        self.frames: list[bytes] = []  # the message being received
        self.message_bytes = 0
        self.out: collections.deque[memoryview] = collections.deque()
        self.out_bytes = 0
        self.retry_at = 0.0  # when to try handing output to libzmq again
        self.backoff = 0.0
        self.closed_at: float | None = None  # when the message closing it went to libzmq
        self.subscriptions = 0  # events socket: subscribes minus cancels

    def describe(self) -> str:
        who = f"pid {self.pid}" if self.pid is not None else "pid unknown"
        return who + (f", uid {self.uid}" if self.uid is not None else "")

    def queue(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            if piece:
                self.out.append(memoryview(piece))
                self.out_bytes += len(piece)

    def next_item(self, max_frames: int, max_bytes: int) -> tuple[bytes | None, object] | None:
        """The next whole message as ``(None, frames)`` or command as ``(name, data)``; None until its last
        frame is in.  Raises ProtocolError past ``max_frames`` frames or ``max_bytes`` bytes in one message."""
        while True:
            frame = self.reader.next()
            if frame is None:
                return None
            flags, body = frame
            if flags & COMMAND:
                if flags & MORE or self.frames:
                    raise ProtocolError("a command frame inside a message or flagged MORE")
                return parse_command(body)
            self.frames.append(body)
            self.message_bytes += len(body)
            if len(self.frames) > max_frames:
                raise ProtocolError(f"a message of more than {max_frames} frames")
            if self.message_bytes > max_bytes:
                raise ProtocolError(f"a message of more than {max_bytes} bytes")
            if not flags & MORE:
                message, self.frames, self.message_bytes = self.frames, [], 0
                return None, message
