"""The daemon's end of ZMTP on its request and events sockets, spoken over Unix sockets it accepts itself.

Why not libzmq's ROUTER and PUB: both keep a multipart message inside the socket until its
last frame arrives, where the application can neither see nor drop it (RCVHWM counts whole
messages, ZMQ_MAXMSGSIZE one frame), so a peer sending frames flagged MORE forever grew the
daemon without bound; a PUB, and an XPUB even with ZMQ_XPUB_MANUAL, stores every
subscription in a trie costing about 50 times its size, whose teardown stalled the server
loop for tens of seconds; and both bound queues in messages, not bytes.  A ZMQ_STREAM socket,
which came next, still accepted for the daemon (aborting it on EMFILE) and kept queues per
connection (stream.py says what that cost).  So the daemon listens, accepts, reads and writes
its ipc sockets itself, parses ZMTP 3.0 itself (zmtp.py), holds at most what bounds.py says
per peer, and cuts a peer past it.  Peers do not change: libzmq DEALER and REQ sockets talk
to the request socket, SUB and XSUB to the events socket.

    bounds.py    how much one peer, and all of them, can make the daemon hold
    zmtp.py      greeting, READY, frames
    places.py    how many connections are kept, in all and per user
    peer.py      one connection's state
    stream.py    the listening socket and its peers: accepting, handshake, output, cutting
    requests.py  the ROUTER the request socket plays (back-pressure per peer)
    events.py    the PUB the events socket plays (subscriptions counted, never kept)

Nothing here knows about requests' meaning: it must not import the daemon, ops or leases.

Must not import: ``engramd.daemon``, ``engramd.guards.lease_limits``, ``engramd.cli``.
"""
from __future__ import annotations

from .events import EventEndpoint
from .requests import RequestEndpoint
from .places import Places
from .stream import listen

__all__ = ["EventEndpoint", "Places", "RequestEndpoint", "listen"]
