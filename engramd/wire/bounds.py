"""How much one peer on the request or events socket can make the daemon hold, in bytes, and
how many peers it keeps.

Per connection on the request socket, at most:

    the kernel          the socket's receive and send buffers (SO_RCVBUF, SO_SNDBUF)
    unparsed requests   IN_BYTES                  past it the peer is cut (it sends faster than it is answered,
                                                  or sends while it does not read its replies)
    one message         MAX_FRAMES frames, MAX_MESSAGE_BYTES in all; past either the peer is cut
    replies waiting     OUT_BYTES + one reply     past OUT_BYTES no further request of that peer is taken
                                                  until it reads (its requests wait, unparsed, above)

about 2 MiB for a peer that neither reads nor stops sending.  Across peers, TOTAL_IN_BYTES
and TOTAL_OUT_BYTES bound the two queues the daemon itself keeps: past the first the peer
holding most unparsed input is cut, past the second no peer with replies waiting gets
another until it reads.  A subscriber on the events socket sends nothing the daemon keeps:
subscriptions are read, counted and dropped, a frame over SUBSCRIPTION_BYTES cuts the
subscriber, and at most EVENT_OUT_BYTES of events and PONGs wait for one (further events are
not queued for it: a subscriber that does not read misses events, as with any PUB; a PING
past it cuts the subscriber, which sends and does not read).

Connections (places.py): the daemon accepts them itself, at most ACCEPTS_PER_READ per turn of
the server loop (the kernel holds the rest in the listening socket's BACKLOG), and reads each
READ_BYTES at a time.  A user other than root and the daemon's own has at most 1/USER_SHARE of
the places; root and the daemon's user have RESERVED_PLACES beyond the limit, so they are
always answered.  A connection that has not completed the ZMTP handshake within HANDSHAKE_S
is cut, and so is one that has sent nothing for the idle time the server sets (a few lease
lengths) while it holds nothing here: no input, no output, no subscription.
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

READ_BYTES = 64 * 1024  # one recv from one peer per turn
SEND_PIECES = 64  # pieces (frame headers and bodies) handed to one sendmsg
BACKLOG = 256  # connections the kernel queues before the daemon accepts them
ACCEPTS_PER_READ = 64  # so a flood of connections cannot starve the peers already served
ACCEPT_PAUSE_S = 0.1  # the descriptors ran out (EMFILE): accept again after this
HANDSHAKE_S = 5.0  # a connection that has not completed the ZMTP handshake by then is cut
USER_SHARE = 4  # one user (not root, not the daemon's) holds at most a quarter of the places
RESERVED_PLACES = 8  # beyond the limit, for root and the daemon's own user only
