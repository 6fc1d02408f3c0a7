"""Status over TCP for remote monitoring, only with CURVE authentication.

A TCP endpoint answers ``status`` and nothing else, and only to clients whose CURVE
public key sits in the authorized-keys directory: without that, anyone who can reach
the port could read the node's state.  Keys come from ``engramd keys DIR``:

    DIR/server.key, DIR/server.key_secret    the daemon's keypair
    DIR/client.key, DIR/client.key_secret    a monitoring client's keypair
    DIR/authorized/                          public keys allowed to connect (client.key is put there)

A peer that has not completed the CURVE handshake within HANDSHAKE_S is disconnected (libzmq's
default, 30 s, let connections that never start one pin a descriptor each), and the server
counts these connections, handshaken or not, and cuts those past their share (PeerCap).

Owns the TCP socket and its authenticator thread; requests are answered by the server.
"""
from __future__ import annotations

import os
import shutil

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from engram_client.core import protocol
from engram_client.core.errors import EngramError

from ..wire.bounds import HANDSHAKE_S


class CurveConfigError(EngramError):
    code = "bad_config"


def create_keys(directory: str) -> dict[str, str]:
    """Write a server and a client keypair, and authorize the client; returns the paths."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    authorized = os.path.join(directory, "authorized")
    os.makedirs(authorized, mode=0o700, exist_ok=True)
    server_public, server_secret = zmq.auth.create_certificates(directory, "server")
    client_public, client_secret = zmq.auth.create_certificates(directory, "client")
    shutil.copy(client_public, os.path.join(authorized, "client.key"))
    for path in (server_secret, client_secret):
        os.chmod(path, 0o600)
    return {"server_public": server_public, "server_secret": server_secret, "client_public": client_public,
            "client_secret": client_secret, "authorized": authorized}


def load_keypair(path: str) -> tuple[bytes, bytes]:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise CurveConfigError(f"cannot read CURVE key {path}: {exc}") from exc
    if secret is None:
        raise CurveConfigError(f"{path} holds no secret key (use the .key_secret file)")
    return public, secret


class RemoteStatus:
    """A CURVE-authenticated ROUTER on a TCP endpoint."""

    def __init__(self, context: zmq.Context, endpoint: str, keys_dir: str):
        if not endpoint.startswith("tcp://"):
            raise CurveConfigError(f"--remote-status {endpoint!r} must be a tcp:// endpoint")
        authorized = os.path.join(keys_dir, "authorized")
        if not os.path.isdir(authorized) or not os.listdir(authorized):
            raise CurveConfigError(f"no authorized client keys in {authorized}; run `engramd keys {keys_dir}`")
        public, secret = load_keypair(os.path.join(keys_dir, "server.key_secret"))
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
