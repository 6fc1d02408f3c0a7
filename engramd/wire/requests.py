"""The request socket: the daemon plays a ROUTER to DEALER and REQ peers, with back-pressure per peer.

A peer's bytes stay unparsed until the server asks for requests; a request is taken out only
while that peer has less than OUT_BYTES of replies waiting (and, if it has any waiting, while
all peers together have less than TOTAL_OUT_BYTES), so a peer that does not read its replies
stops being answered, and its further requests wait as raw bytes until IN_BYTES, past which it
is cut (stream.py).  Past TOTAL_IN_BYTES unparsed over all peers, the peer holding most is cut.
Peers are served in turn, one request each per round.
"""
from __future__ import annotations

from collections.abc import Iterator

from engram_client.core.errors import ProtocolError

from .bounds import MAX_FRAMES, MAX_MESSAGE_BYTES, OUT_BYTES, TOTAL_IN_BYTES, TOTAL_OUT_BYTES
from .zmtp import encode
from .peer import OPEN, Peer
from .stream import StreamEndpoint


class RequestEndpoint(StreamEndpoint):
    socket_type = b"ROUTER"
    peer_types = frozenset({b"DEALER", b"REQ", b"ROUTER"})
    max_frame = MAX_MESSAGE_BYTES
    out_limit = OUT_BYTES

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._readable: dict[Peer, None] = {}  # open peers that may have a request to take, in turn order
        self._blocked: set[Peer] = set()  # open peers with input, not answered until they read their replies

    def on_input(self, peer: Peer) -> None:
        if peer not in self._blocked:
            self._readable[peer] = None
        if self.unparsed.bytes > TOTAL_IN_BYTES:
            hog = max((p for p in self.peers.values() if p.reader is not None), key=lambda p: p.reader.unparsed)
            self.close(hog, f"the requests waiting from all peers passed {TOTAL_IN_BYTES} bytes; "
                            f"it held the most ({hog.reader.unparsed} bytes)")

    def has_work(self) -> bool:
        return bool(self._readable)

    def _may_answer(self, peer: Peer) -> bool:
        return peer.out_bytes < OUT_BYTES and (not peer.out_bytes or self.out_total < TOTAL_OUT_BYTES)

    def drained(self, peer: Peer) -> None:
        if peer in self._blocked and self._may_answer(peer):
            self._blocked.discard(peer)
            self._readable[peer] = None

    def requests(self, limit: int) -> Iterator[tuple[Peer, list[bytes]]]:
        """Up to ``limit`` whole requests as (peer, frames), one per peer per round."""
        taken = 0
        while taken < limit and self._readable:
            for peer in list(self._readable):
                if peer.state != OPEN:
                    self._readable.pop(peer, None)
                    continue
                if not self._may_answer(peer):
                    self._readable.pop(peer, None)
                    self._blocked.add(peer)
                    continue
                try:
                    item = peer.next_item(MAX_FRAMES, MAX_MESSAGE_BYTES)
                    if item is not None and item[0] is not None:
                        self.command(peer, *item)
                        continue
                except ProtocolError as exc:
                    self.close(peer, str(exc))
                    continue
                if item is None:
                    self._readable.pop(peer, None)
                    continue
                body = item[1]
                taken += 1
                yield peer, body
                if taken >= limit:
                    return

    def gone(self, peer: Peer) -> None:
        self._readable.pop(peer, None)
        self._blocked.discard(peer)

    def holds_something(self, peer: Peer) -> bool:
        return peer in self._readable or peer in self._blocked or super().holds_something(peer)

    def reply(self, peer: Peer, frames: list[bytes]) -> None:
        """Queue a reply's frames (after the routing identity) for ``peer``; a peer gone or cut gets nothing."""
        if peer.state == OPEN:
            self._send(peer, encode(frames))
