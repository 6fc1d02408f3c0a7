"""Cutting a connection that libzmq cannot be asked to close: a peer whose outbound queue is full.

A STREAM socket closes a connection when the application sends it an empty message, and that
message queues behind everything else for the peer; a peer that reads nothing never lets it
through.  Then the daemon finds the connection's descriptor itself, among its own: a connected
AF_UNIX stream socket whose local name is the daemon's socket path, whose peer is ``pid``
(SO_PEERCRED) and whose kernel send queue is not empty (that peer is not reading), and shuts it
down; libzmq then sees a peer that left and frees its queue.  Only connections of the process
that misbehaves can match: another process's, and the listening socket, never do.
"""
from __future__ import annotations

import array
import fcntl
import os
import socket
import struct
import termios



def _unsent_bytes(fd: int) -> int:
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.TIOCOUTQ, count)  # SIOCOUTQ on a socket
    return count[0]


def shut_down(path: str, pid: int) -> int:
    """Shut down the not-reading connections of process ``pid`` to the socket at ``path``; returns how many."""
    cut = 0
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return 0
    for name in names:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=int(name))
        except (OSError, ValueError):
            continue
        try:
            if (sock.family == socket.AF_UNIX and sock.type == socket.SOCK_STREAM
                    and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                    and sock.getsockname() == path
                    and struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0] == pid
                    and _unsent_bytes(sock.fileno()) > 0):
                sock.shutdown(socket.SHUT_RDWR)
                cut += 1
        except OSError:
            pass
        finally:
            sock.detach()  # the descriptor stays libzmq's: it closes it once it sees the shutdown
    return cut
