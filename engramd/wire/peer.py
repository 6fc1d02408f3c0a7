"""One connection on a socket the daemon listens on: where its handshake stands, its input, its output, who it is.

    greeting ──▶ handshake ──▶ open ──▶ closed (its descriptor closed, its place given back)
       │             │                     ▲
       └─────────────┴─────────────────────┘  a broken rule, a bound, or the peer leaving, at any step

Input is kept raw (FrameReader) until the endpoint takes a message out of it; output is a
queue of byte pieces written to the socket as fast as the peer reads.
"""
from __future__ import annotations

import collections
import socket
import struct
import time

from engram_client.core.errors import ProtocolError

from .zmtp import COMMAND, MORE, FrameReader, Tally, parse_command

GREETING, HANDSHAKE, OPEN, CLOSED = "greeting", "handshake", "open", "closed"


def credentials(sock: socket.socket) -> tuple[int | None, int]:
    """(pid, uid) of an AF_UNIX peer as the kernel says (SO_PEERCRED); pid None where it cannot say (0: the
    peer lives in a pid namespace the daemon cannot see)."""
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return (pid or None), uid


class Peer:
    def __init__(self, identity: bytes, sock: socket.socket | None, pid: int | None, uid: int, max_frame: int,
                 tally: Tally):
        self.identity = identity  # unique for the daemon's lifetime, unlike a descriptor number
        self.sock = sock
        self.fd = sock.fileno() if sock is not None else -1
        self.pid, self.uid = pid, uid
        self.state = GREETING
        self.connected_at = self.active_at = time.monotonic()  # active_at: when it last sent anything
        self.reader: FrameReader | None = FrameReader(max_frame, tally)
        self.frames: list[bytes] = []  # the message being received
        self.message_bytes = 0
        self.out: collections.deque[memoryview] = collections.deque()
        self.out_bytes = 0
        self.writing = False  # whether the endpoint waits for its socket to take more output
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
