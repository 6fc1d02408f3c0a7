"""A ZMQ_STREAM socket on which the daemon plays one ZMTP socket type to every peer.

libzmq hands a STREAM socket's application each connection's bytes as they are read (at
most RCVHWM chunks of 8 KiB wait inside it) and announces connections and disconnections
with empty messages.  This class keeps one Peer per connection, answers the handshake,
cuts peers that break a rule or a bound (bounds.py), and hands queued output to libzmq
chunk by chunk while the peer reads: libzmq refuses a chunk (EAGAIN) once SNDHWM of them
wait, and the rest waits here, counted per peer.  A peer whose queue is full cannot be
sent the message that closes it; then its descriptor is shut down directly (cut.py).
Subclasses say what a peer may send once open (``on_input``).  Server thread only.
"""
from __future__ import annotations

import time

import zmq

from engram_client.core.errors import ProtocolError

from .bounds import CHUNK_BYTES, HANDSHAKE_S, IN_BYTES, RCVHWM_CHUNKS, SNDHWM_CHUNKS
from .zmtp import GREETING_BYTES, OUR_GREETING, Tally, check_greeting, command, parse_properties, ready
from .cut import shut_down
from .peer import CLOSING, GREETING, HANDSHAKE, OPEN, Peer

HANDSHAKE_FRAME = 4096  # a READY command with its properties
MAX_BACKOFF_S = 0.1


def configure(sock: zmq.Socket) -> None:
    """Options a STREAM socket needs before bind (the listener hands them to each connection)."""
    sock.setsockopt(zmq.SNDHWM, SNDHWM_CHUNKS)
    sock.setsockopt(zmq.RCVHWM, RCVHWM_CHUNKS)


class StreamEndpoint:
    socket_type = b""
    peer_types: frozenset[bytes] = frozenset()
    max_frame = 0

    def __init__(self, sock: zmq.Socket, path: str | None, notes):
        self.sock = sock
        self.path = path  # the ipc socket's path, to find a peer's descriptor by
        self.notes = notes  # a LogLimiter: what peers make us log is bounded
        self.peers: dict[bytes, Peer] = {}
        self.out_total = 0
        self.unparsed = Tally()  # input held by all peers together
        self._waiting: set[Peer] = set()  # peers with output libzmq has not taken yet
        self._housekept = 0.0

    # -- input -------------------------------------------------------------------------
    def read(self, max_chunks: int = 256) -> None:
        """Take what the socket holds (at most ``max_chunks`` chunks): connections, disconnections, bytes."""
        for _ in range(max_chunks):
            try:
                identity = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            peer = self.peers.get(identity)
            if peer is None:  # a new connection: its frame carries the peer's credentials
                data = self.sock.recv(copy=False)
                if not data.bytes:
                    self._connected(identity, data)
                continue
            body = self.sock.recv()
            if not body:
                self._gone(peer)
            elif peer.state != CLOSING:
                peer.reader.feed(body)
                try:
                    if peer.state != OPEN:
                        self._handshake(peer)
                    if peer.state == OPEN:
                        self.on_input(peer)
                    if peer.reader is not None and peer.reader.unparsed > IN_BYTES:
                        raise ProtocolError(f"more than {IN_BYTES} bytes of its requests wait unanswered "
                                            "(it sends faster than it is answered, or does not read its replies)")
                except ProtocolError as exc:
                    self.close(peer, str(exc))

    def _connected(self, identity: bytes, data: zmq.Frame) -> None:
        try:
            address = data.get("Peer-Address")
        except zmq.ZMQError:
            address = None
        peer = self.peers[identity] = Peer(identity, address, HANDSHAKE_FRAME, self.unparsed)
        self._send(peer, [OUR_GREETING, ready(self.socket_type)])

    def _handshake(self, peer: Peer) -> None:
        if peer.state == GREETING:
            if not check_greeting(peer.reader.peek(GREETING_BYTES)):
                return
            peer.reader.take(GREETING_BYTES)
            peer.state = HANDSHAKE
        item = peer.next_item(1, HANDSHAKE_FRAME)
        if item is None:
            return
        name, data = item
        if name != b"READY":
            raise ProtocolError(f"expected the READY command, got {name[:20]!r}" if name else
                                "expected the READY command, got a message")
        socket_type = parse_properties(data).get(b"Socket-Type", b"")
        if socket_type not in self.peer_types:
            raise ProtocolError(f"a {socket_type[:20].decode(errors='replace') or 'nameless'} socket; this one takes "
                                + ", ".join(sorted(t.decode() for t in self.peer_types)))
        peer.state = OPEN
        peer.reader.max_frame = self.max_frame

    def on_input(self, peer: Peer) -> None:
        """An open peer sent bytes (subclasses: parse now, or leave them for later)."""

    def has_work(self) -> bool:
        """Input is parsed and waits to be handled (subclasses that parse later)."""
        return False

    def command(self, peer: Peer, name: bytes, data: bytes) -> None:
        """A command from an open peer: PING is answered; anything a subclass does not take is ignored."""
        if name == b"PING":
            self._send(peer, [command(b"PONG", data[2:18])])
        elif name == b"ERROR":
            raise ProtocolError("the peer sent ERROR")

    def _gone(self, peer: Peer) -> None:
        if peer.reader is not None:
            peer.reader.discard()
            peer.reader = None
        peer.state = CLOSING
        self._drop_output(peer)
        self.peers.pop(peer.identity, None)

    # -- output ------------------------------------------------------------------------
    def _send(self, peer: Peer, pieces: list[bytes]) -> None:
        before = peer.out_bytes
        peer.queue(pieces)
        self.out_total += peer.out_bytes - before
        self._waiting.add(peer)
        self._hand_over(peer, time.monotonic())

    def _hand_over(self, peer: Peer, now: float) -> None:
        """Give libzmq this peer's output, a chunk at a time, until it takes no more."""
        while peer.out:
            parts, size = [], 0
            while peer.out and size < CHUNK_BYTES:
                piece = peer.out[0]
                take = min(len(piece), CHUNK_BYTES - size)
                parts.append(piece[:take])
                size += take
                if take == len(piece):
                    peer.out.popleft()
                else:
                    peer.out[0] = piece[take:]
            chunk = b"".join(parts)
            try:
                self.sock.send_multipart([peer.identity, chunk], zmq.NOBLOCK)
            except zmq.Again:
                peer.out.appendleft(memoryview(chunk))
                peer.backoff = min(MAX_BACKOFF_S, max(0.001, peer.backoff * 2))
                peer.retry_at = now + peer.backoff
                return
            except zmq.ZMQError:  # the connection is gone; its disconnection message follows or came already
                peer.out.clear()
                size = peer.out_bytes
            peer.out_bytes -= size
            self.out_total -= size
            peer.backoff = 0.0
            self.drained(peer)
        self._waiting.discard(peer)

    def drained(self, peer: Peer) -> None:
        """libzmq took some of ``peer``'s output (subclasses: it may be answered again)."""

    def _drop_output(self, peer: Peer) -> None:
        peer.out.clear()
        self.out_total -= peer.out_bytes
        peer.out_bytes = 0
        self._waiting.discard(peer)

    def flush(self) -> None:
        """Retry the peers whose output waits and whose turn has come; cut handshakes that ran out of time."""
        now = time.monotonic()
        for peer in [peer for peer in self._waiting if peer.retry_at <= now]:
            self._hand_over(peer, now)
        if now - self._housekept >= 0.1:
            self._housekept = now
            for peer in list(self.peers.values()):
                if peer.state in (GREETING, HANDSHAKE) and now - peer.connected_at > HANDSHAKE_S:
                    self.close(peer, f"no ZMTP handshake within {HANDSHAKE_S:g} s")
                elif peer.state == CLOSING and peer.closed_at is None and now >= peer.retry_at:
                    self._send_close(peer, now)
                elif peer.closed_at is not None and now - peer.closed_at > HANDSHAKE_S:
                    self.peers.pop(peer.identity, None)  # its disconnection message normally comes at once

    def wait_s(self) -> float | None:
        """How long the server may sleep before some peer's output should be retried (None: nothing waits)."""
        if self.has_work():
            return 0.0
        if not self._waiting:
            return None
        return max(0.0, min(peer.retry_at for peer in self._waiting) - time.monotonic())

    # -- cutting a peer ----------------------------------------------------------------
    def close(self, peer: Peer, why: str) -> None:
        """Disconnect ``peer`` now: nothing more is read from it or sent to it."""
        if peer.state == CLOSING:
            return
        self.notes.warning(f"cut peers ({self.socket_type.decode()} socket)", "cut a peer (%s) on %s: %s",
                           peer.describe(), self.path, why)
        peer.state = CLOSING
        peer.reader.discard()
        peer.reader = None
        self._drop_output(peer)
        peer.backoff = 0.0
        self._send_close(peer, time.monotonic(), first=True)

    def _send_close(self, peer: Peer, now: float, first: bool = False) -> None:
        try:
            self.sock.send_multipart([peer.identity, b""], zmq.NOBLOCK)  # an empty message closes a STREAM peer
        except zmq.Again:
            # Its libzmq queue is full and it reads nothing: the closing message would wait forever.
            if first and peer.pid is not None and self.path is not None:
                shut_down(self.path, peer.pid)
            peer.backoff = min(1.0, max(0.01, peer.backoff * 2))
            peer.retry_at = now + peer.backoff
            return
        except zmq.ZMQError:
            pass  # gone already
        peer.closed_at = now
