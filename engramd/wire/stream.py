"""A Unix stream socket the daemon listens on and plays one ZMTP socket type on, to every peer.

The daemon accepts each connection itself, reads and writes it with non-blocking calls (one
epoll set per socket, whose descriptor the server polls), and closes it itself.  libzmq is
not in between: a ZMQ_STREAM socket accepted as fast as the kernel handed connections over
and aborted the process when accept(2) ran out of descriptors (EMFILE), kept queues of its
own for every connection until the application read their notifications (connect/close
churn grew the daemon by 1.3 GiB in 5 s), and reported connections through a monitor the
daemon read only later.  Here a connection gets a place (places.py) before anything else,
or is closed at once; accept stops for a moment when descriptors run out; and a peer is cut
by closing its descriptor, whatever its queues hold.  This class keeps one Peer per
connection, answers the handshake, cuts peers that break a rule or a bound (bounds.py), and
writes queued output as the peer reads it.  Subclasses say what a peer may send once open
(``on_input``).  Server thread only.
"""
from __future__ import annotations

import errno
import itertools
import os
import selectors
import socket
import time

from engram_client.core.errors import ProtocolError

from .bounds import (ACCEPT_PAUSE_S, ACCEPTS_PER_READ, BACKLOG, HANDSHAKE_S, IN_BYTES, READ_BYTES,
                     SEND_PIECES)
from .peer import CLOSED, GREETING, HANDSHAKE, OPEN, Peer, credentials
from .places import Places
from .zmtp import GREETING_BYTES, OUR_GREETING, Tally, check_greeting, command, parse_properties, ready

HANDSHAKE_FRAME = 4096  # a READY command with its properties


def listen(path: str) -> socket.socket:
    """A listening socket at ``path``.  A stale socket there is replaced: the caller checked that it may
    go (guards/safe_paths.check_bind_path)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
    try:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        sock.bind(path)
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


class StreamEndpoint:
    socket_type = b""
    peer_types: frozenset[bytes] = frozenset()
    max_frame = 0
    out_limit = 0  # output waiting past which a PING cuts the peer instead of queueing a PONG

    def __init__(self, listener: socket.socket, path: str, notes, places: Places, idle_s: float):
        self.listener = listener
        self.path = path
        self.notes = notes  # a LogLimiter: what peers make us log is bounded
        self.places = places  # shared by both sockets: one descriptor table
        self.idle_s = idle_s
        self.peers: dict[int, Peer] = {}  # by descriptor
        self.out_total = 0
        self.unparsed = Tally()  # input held by all peers together
        self._selector = selectors.EpollSelector()
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._ids = itertools.count(1)
        self._accept_at: float | None = None  # accepting paused (descriptors ran out) until then
        self._housekept = 0.0

    def fileno(self) -> int:
        """Readable when a connection or a peer's bytes wait, or a peer can take output (for the server's poll)."""
        return self._selector.fileno()

    # -- input -------------------------------------------------------------------------
    def read(self) -> None:
        """Take what is ready: new connections (ACCEPTS_PER_READ at most), each ready peer's bytes, output room."""
        for key, mask in self._selector.select(0):
            peer = key.data
            if peer is None:
                self._accept()
                continue
            if mask & selectors.EVENT_WRITE and peer.state != CLOSED:
                self._hand_over(peer)
            if mask & selectors.EVENT_READ and peer.state != CLOSED:
                self._receive(peer)

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_READ):
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                # Out of descriptors (a burst, or another listener's peers): the kernel keeps the
                # connections queued meanwhile.  libzmq aborted the process here.
                self._selector.unregister(self.listener)
                self._accept_at = time.monotonic() + ACCEPT_PAUSE_S
                self.notes.warning("accept paused", "cannot accept connections on %s (%s): retrying in %g s",
                                   self.path, exc.strerror, ACCEPT_PAUSE_S)
                return
            try:
                pid, uid = credentials(conn)
            except OSError:
                conn.close()
                continue
            why = self.places.take(uid)
            if why is not None:
                conn.close()
                self.notes.warning("refused connections", "refused a connection (pid %s, uid %d) on %s: %s",
                                   pid, uid, self.path, why)
                continue
            conn.setblocking(False)
            peer = Peer(next(self._ids).to_bytes(8, "big"), conn, pid, uid, HANDSHAKE_FRAME, self.unparsed)
            self.peers[peer.fd] = peer
            self._selector.register(conn, selectors.EVENT_READ, peer)
            self._send(peer, [OUR_GREETING, ready(self.socket_type)])

    def _receive(self, peer: Peer) -> None:
        try:
            data = peer.sock.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._release(peer)  # it left
            return
        peer.active_at = time.monotonic()
        peer.reader.feed(data)
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

    def holds_something(self, peer: Peer) -> bool:
        """Whether an open peer has anything here that an idle cut would lose (subclasses add theirs)."""
        return bool(peer.out or peer.reader.unparsed or peer.frames)

    def command(self, peer: Peer, name: bytes, data: bytes) -> None:
        """A command from an open peer: PING is answered while the peer reads; anything a subclass does not
        take is ignored."""
        if name == b"PING":
            if peer.out_bytes >= self.out_limit:
                raise ProtocolError(f"PINGs while {peer.out_bytes} bytes wait for it unread (at most "
                                    f"{self.out_limit}): it sends and does not read")
            self._send(peer, [command(b"PONG", data[2:18])])
        elif name == b"ERROR":
            raise ProtocolError("the peer sent ERROR")

    # -- output ------------------------------------------------------------------------
    def _send(self, peer: Peer, pieces: list[bytes]) -> None:
        before = peer.out_bytes
        peer.queue(pieces)
        self.out_total += peer.out_bytes - before
        self._hand_over(peer)

    def _hand_over(self, peer: Peer) -> None:
        """Write this peer's output until its socket takes no more; then wait for room (EVENT_WRITE)."""
        sent_any = False
        while peer.out:
            try:
                sent = peer.sock.sendmsg(list(itertools.islice(peer.out, SEND_PIECES)))
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # it left (EPIPE, ECONNRESET)
                self._release(peer)
                return
            peer.out_bytes -= sent
            self.out_total -= sent
            sent_any = True
            while sent:
                piece = peer.out[0]
                if len(piece) <= sent:
                    peer.out.popleft()
                    sent -= len(piece)
                else:
                    peer.out[0] = piece[sent:]
                    sent = 0
        if bool(peer.out) != peer.writing:
            peer.writing = bool(peer.out)
            self._selector.modify(peer.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if peer.writing else 0),
                                  peer)
        if sent_any:
            self.drained(peer)

    def drained(self, peer: Peer) -> None:
        """The socket took some of ``peer``'s output (subclasses: it may be answered again)."""

    def flush(self) -> None:
        """Accept again once a pause is over; cut handshakes that ran out of time and idle peers."""
        now = time.monotonic()
        if self._accept_at is not None and now >= self._accept_at:
            self._accept_at = None
            self._selector.register(self.listener, selectors.EVENT_READ, None)
        if now - self._housekept < 0.1:
            return
        self._housekept = now
        for peer in list(self.peers.values()):
            if peer.state in (GREETING, HANDSHAKE) and now - peer.connected_at > HANDSHAKE_S:
                self.close(peer, f"no ZMTP handshake within {HANDSHAKE_S:g} s")
            elif (peer.state == OPEN and now - peer.active_at > self.idle_s and not self.holds_something(peer)
                  and not _bytes_pending(peer.sock)):
                self.close(peer, f"sent nothing for {self.idle_s:g} s and holds nothing here")

    def wait_s(self) -> float | None:
        """How long the server may sleep before this endpoint has work that its descriptor does not signal."""
        if self.has_work():
            return 0.0
        if self._accept_at is not None:
            return max(0.0, self._accept_at - time.monotonic())
        return None

    # -- cutting a peer ----------------------------------------------------------------
    def close(self, peer: Peer, why: str) -> None:
        """Disconnect ``peer`` now: nothing more is read from it or sent to it."""
        if peer.state == CLOSED:
            return
        self.notes.warning(f"cut peers ({self.socket_type.decode()} socket)", "cut a peer (%s) on %s: %s",
                           peer.describe(), self.path, why)
        self._release(peer)

    def _release(self, peer: Peer) -> None:
        """Forget ``peer``, close its descriptor and give its place back."""
        if peer.state == CLOSED:
            return
        peer.state = CLOSED
        peer.reader.discard()
        peer.reader = None
        peer.out.clear()
        self.out_total -= peer.out_bytes
        peer.out_bytes = 0
        self.peers.pop(peer.fd, None)
        self._selector.unregister(peer.sock)
        peer.sock.close()
        self.places.give_back(peer.uid)
        self.gone(peer)

    def gone(self, peer: Peer) -> None:
        """``peer`` was closed (subclasses: forget it)."""

    def stop(self) -> None:
        """Close every connection and the listening socket."""
        for peer in list(self.peers.values()):
            self._release(peer)
        self._selector.close()
        self.listener.close()


def _bytes_pending(sock: socket.socket) -> bool:
    """Whether the kernel holds bytes from this peer not read yet (a request arriving as it goes idle)."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True  # an error to read first: not an idle peer to cut silently
