"""File descriptors: as many as the process may have, and never all of them for peers.

Every peer connection costs the daemon one descriptor.  So at start the soft RLIMIT_NOFILE
is raised to the hard limit (the unit sets it with ``LimitNOFILE``).  OWN_FDS of it are kept
for the daemon's own descriptors, and peers get a quarter of the rest, at most MAX_PEERS
(``peer_budget``); the other three quarters are headroom: for connections the daemon
accepts only to close them (wire/places.py says whom), and for a burst on the TCP status
socket, which libzmq accepts faster than PeerCap disconnects the excess.  The ipc sockets
are the daemon's own (wire/stream.py): when accept(2) runs out of descriptors they pause,
where libzmq aborted the process.  A limit that leaves room for fewer than MIN_PEERS is
refused at start, in words.

PeerCap counts the connections of the TCP status socket from a ZeroMQ monitor on it
(accepted and disconnected events carry the connection's descriptor), handshaken or not,
and disconnects an excess peer by shutting its socket down, which libzmq then handles as
a peer that left.
"""
from __future__ import annotations

import logging
import resource
import socket

import zmq
from zmq.utils.monitor import parse_monitor_message

from engram_client.core.errors import ConfigError

log = logging.getLogger("engramd.fd_limits")
MAX_PEERS = 4096  # a node runs a few hundred clients at most
MIN_PEERS = 8  # a node's ranks and a tool or two
# The daemon's own descriptors (stdio, the lock files, both listening sockets and their
# monitors, libzmq's eventfds), counted with `ls /proc/PID/fd`: 20 on the demo table at rest,
# 34 with --metrics-port, --remote-status and a reload of a 4-shard checkpoint running.
OWN_FDS = 64
PEER_SHARE = 4  # one descriptor per peer, three more of headroom (see above)
MIN_NOFILE = OWN_FDS + PEER_SHARE * MIN_PEERS


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft descriptor limit to the hard one; returns (soft, hard) now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft, hard


def peer_budget(soft_limit: int) -> int:
    """How many peers may be connected at once under ``soft_limit`` descriptors; ConfigError if
    the limit is too low to serve at all."""
    if soft_limit < MIN_NOFILE:
        raise ConfigError(f"the open-file limit (RLIMIT_NOFILE) is {soft_limit}, even raised to its hard limit; "
                          f"engramd needs at least {MIN_NOFILE}: {OWN_FDS} for its own files and sockets and "
                          f"{PEER_SHARE} per peer for {MIN_PEERS} peers. Raise it (ulimit -n, systemd LimitNOFILE=, "
                          "docker run --ulimit nofile=...)")
    return min(MAX_PEERS, (soft_limit - OWN_FDS) // PEER_SHARE)


class PeerCap:
    """Counts the connections of the listening sockets it watches (together, since they
    share one descriptor table) and disconnects those beyond ``limit``."""

    EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED

    def __init__(self, limit: int):
        self.limit = limit
        self.monitors: list[zmq.Socket] = []
        self.peers: set[int] = set()
        self.refused = 0

    def watch(self, sock: zmq.Socket) -> None:
        monitor = sock.get_monitor_socket(self.EVENTS)
        # Unbounded on our side: a dropped 'disconnected' event would leave a peer counted forever.
        monitor.setsockopt(zmq.RCVHWM, 0)
        self.monitors.append(monitor)

    def poll(self) -> None:
        """Take every pending event; disconnect peers past the limit."""
        for monitor in self.monitors:
            while True:
                try:
                    event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
                fd = event["value"]
                if event["event"] != zmq.EVENT_ACCEPTED:
                    self.peers.discard(fd)
                elif len(self.peers) >= self.limit:
                    self._disconnect(fd)
                else:
                    self.peers.add(fd)

    def _disconnect(self, fd: int) -> None:
        self.refused += 1
        if self.refused == 1 or self.refused % 1000 == 0:
            log.warning("refusing TCP status peers: %d connected, the most allowed (%d refused so far)",
                        len(self.peers), self.refused)
        try:
            peer = socket.socket(fileno=fd)
        except OSError:
            return  # already gone, or no longer a socket
        try:
            # Only a connected stream, never a listener or a datagram socket of ours that got the number.
            if peer.type == socket.SOCK_STREAM and not peer.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                peer.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            peer.detach()  # the descriptor is libzmq's: it closes it once it sees the shutdown

    def close(self) -> None:
        for monitor in self.monitors:
            monitor.close(linger=0)
        self.monitors.clear()
