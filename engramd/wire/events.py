"""The events socket: the daemon plays a PUB to SUB and XSUB peers and keeps none of their subscriptions.

The daemon publishes one kind of message, so a subscriber's subscriptions are only counted
(subscribe +1, cancel -1; the ZMTP 3.0 message form and the 3.1 SUBSCRIBE/CANCEL commands
alike) and their bodies dropped as they are read: nothing a subscriber sends is kept, a frame
over SUBSCRIPTION_BYTES or a message over MAX_FRAMES cuts it.  An event goes to every open
peer with a subscription (a SUB filters by its own prefixes on its side); a subscriber with
EVENT_OUT_BYTES of events unread misses the next ones, and one that PINGs with that much
unread is cut (each PING asks for a PONG: queueing them all grew the daemon by 900 MiB in 30 s).
"""
from __future__ import annotations

from .bounds import EVENT_OUT_BYTES, MAX_FRAMES, SUBSCRIPTION_BYTES
from .zmtp import encode
from .peer import OPEN, Peer
from .stream import StreamEndpoint


class EventEndpoint(StreamEndpoint):
    socket_type = b"PUB"
    peer_types = frozenset({b"SUB", b"XSUB"})
    max_frame = SUBSCRIPTION_BYTES
    out_limit = EVENT_OUT_BYTES

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dropped = 0  # events a subscriber did not get because it did not read the earlier ones

    def on_input(self, peer: Peer) -> None:
        while True:
            item = peer.next_item(MAX_FRAMES, MAX_FRAMES * SUBSCRIPTION_BYTES)
            if item is None:
                return
            name, body = item
            if name is None:
                first = body[0][:1]
                peer.subscriptions += 1 if first == b"\x01" else -1 if first == b"\x00" else 0
            elif name in (b"SUBSCRIBE", b"CANCEL"):
                peer.subscriptions += 1 if name == b"SUBSCRIBE" else -1
            else:
                self.command(peer, name, body)
            if peer.state != OPEN:
                return

    def holds_something(self, peer: Peer) -> bool:
        return peer.subscriptions > 0 or super().holds_something(peer)

    def publish(self, frames: list[bytes]) -> None:
        pieces = encode(frames)
        size = sum(len(piece) for piece in pieces)
        for peer in list(self.peers.values()):
            if peer.state != OPEN or peer.subscriptions <= 0:
                continue
            if peer.out_bytes + size > EVENT_OUT_BYTES:
                self.dropped += 1
                continue
            self._send(peer, pieces)
