"""How much one peer on the request or events socket can make the daemon hold, in bytes.

Per connection on the request socket, at most:

    libzmq, inbound     RCVHWM_CHUNKS x 8 KiB     raw bytes read from the socket, not yet taken
    unparsed requests   IN_BYTES                  past it the peer is cut (it sends faster than it is answered,
                                                  or sends while it does not read its replies)
    one message         MAX_FRAMES frames, MAX_MESSAGE_BYTES in all; past either the peer is cut
    replies waiting     OUT_BYTES + one reply     past OUT_BYTES no further request of that peer is taken
                                                  until it reads (its requests wait, unparsed, above)
    libzmq, outbound    SNDHWM_CHUNKS x CHUNK_BYTES

about 3 MiB for a peer that neither reads nor stops sending.  Across peers, TOTAL_IN_BYTES
and TOTAL_OUT_BYTES bound the two queues the daemon itself keeps: past the first the peer
holding most unparsed input is cut, past the second no peer with replies waiting gets
another until it reads.  A subscriber on the events socket sends nothing the daemon keeps:
subscriptions are read, counted and dropped, a frame over SUBSCRIPTION_BYTES cuts the
subscriber, and at most EVENT_OUT_BYTES of events wait for one (further events are not
queued for it: a subscriber that does not read misses events, as with any PUB).
"""
from __future__ import annotations

from engram_client.core.protocol import MAX_REQUEST_BYTES

MAX_FRAMES = 8  # a request is one payload frame (two through REQ); a few more still get their error reply
MAX_MESSAGE_BYTES = MAX_REQUEST_BYTES  # all frames of one request together
IN_BYTES = 1024 * 1024  # about 16,000 pipelined status requests
OUT_BYTES = 1024 * 1024  # more than one status reply listing 1,024 clients (~700 KiB)
TOTAL_IN_BYTES = 64 * 1024 * 1024
TOTAL_OUT_BYTES = 128 * 1024 * 1024

SUBSCRIPTION_BYTES = 256  # the daemon publishes one kind of event; a subscription is b"" or a short prefix
EVENT_OUT_BYTES = 64 * 1024  # several hundred events

CHUNK_BYTES = 64 * 1024  # what one message on the STREAM socket carries
SNDHWM_CHUNKS = 4
RCVHWM_CHUNKS = 16
HANDSHAKE_S = 5.0  # a connection that has not completed the ZMTP handshake by then is cut
