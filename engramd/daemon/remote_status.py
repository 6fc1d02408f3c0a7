"""Status over TCP for remote monitoring, only with CURVE authentication.

A TCP endpoint answers ``status`` and nothing else, and only to clients whose CURVE
public key sits in the authorized-keys directory: without that, anyone who can reach
the port could read the node's state.  The keys, and the checks on who may change them,
are engramd/guards/curve_keys.py's.

A peer that has not completed the CURVE handshake within HANDSHAKE_S is disconnected (libzmq's
default, 30 s, let connections that never start one pin a descriptor each), and the server
counts these connections, handshaken or not, and cuts those past their share (PeerCap).

Owns the TCP socket and its authenticator thread; requests are answered by the server.
"""
from __future__ import annotations

import zmq
from zmq.auth.thread import ThreadAuthenticator

from engram_client.core import protocol

from ..wire.bounds import HANDSHAKE_S
from ..guards.curve_keys import CurveConfigError, server_keys


class RemoteStatus:
    """A CURVE-authenticated ROUTER on a TCP endpoint."""

    def __init__(self, context: zmq.Context, endpoint: str, keys_dir: str):
        if not endpoint.startswith("tcp://"):
            raise CurveConfigError(f"--remote-status {endpoint!r} must be a tcp:// endpoint")
        authorized, public, secret = server_keys(keys_dir)
        self.auth = ThreadAuthenticator(context)
        self.auth.start()
        self.auth.configure_curve(domain="*", location=authorized)
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_REQUEST_BYTES)
        self.socket.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_S * 1000))
        self.socket.curve_server = True
        self.socket.curve_publickey, self.socket.curve_secretkey = public, secret
        try:
            self.socket.bind(endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise CurveConfigError(f"cannot bind {endpoint}: {exc}") from exc
        self.endpoint = endpoint

    def close(self) -> None:
        self.socket.close(linger=0)
        self.auth.stop()
