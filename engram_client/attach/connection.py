"""Request/reply with engramd over one DEALER socket, every wait bounded.

A request that times out closes the socket and opens a new one, so a late reply
to it can never be taken for the answer to the next request.  One lock serialises
callers (the rank's thread and the heartbeat thread share a connection).

On an ``ipc://`` path nobody may slip in between two requests (socket_trust.py says whom
a client trusts).  Each ZeroMQ socket talks to one listener only: libzmq's own reconnect
is off, and a socket is connected only once a socket file is at the path and passes the
trust check (the request waits for one, bounded by its timeout).  Before every request
the file at the path must still be the one checked, else the socket is closed and a new
one connects after checking again; a daemon that went away is found the same way.  Every
reply must come from a process of root, this user, or the checked socket's owner (its
SO_PEERCRED, which libzmq reports as the reply's Peer-Address), which closes the moment
between the check and the connect.

A connection belongs to the process that made it: libzmq's I/O thread does not survive
fork(2), and a forked child that used the inherited socket would spin forever in
zmq_poll.  In a child every request raises NotAttachedError at once, and closing only
drops the parent's socket (pyzmq never closes a socket in a process that did not open it).
"""
from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any

import zmq

from ..core import endpoints, protocol
from ..core.errors import (REPLY_ERRORS, DaemonUnavailableError, NotAttachedError, ProtocolError, RequestError,
                          SocketRefusedError)
from .socket_trust import check_reply_sender, check_socket_trust

FILE_POLL_S = 0.02  # while a request waits for a socket file to appear (a daemon starting)
REPLY_CHECK_S = 0.1  # while a request waits for its reply: how often the socket file is looked at


class DaemonConnection:
    def __init__(self, endpoint: str | None = None, curve_keys_dir: str | None = None) -> None:
        self.endpoint = endpoint or endpoints.default_endpoint()
        self.curve_keys_dir = curve_keys_dir
        if self.endpoint.startswith("tcp://") and curve_keys_dir is None:
            raise ProtocolError(f"{self.endpoint}: engramd serves TCP only with CURVE; give the keys directory "
                                "(curve_keys_dir=, or engramd status --curve-keys-dir DIR)")
        self._path = endpoints.ipc_path(self.endpoint)
        self._check_socket_access()
        self._owner_pid = os.getpid()
        self._context = zmq.Context.instance()
        self._socket: zmq.Socket | None = None
        self._socket_file: os.stat_result | None = None  # the checked file the socket connected through
        self._ids = itertools.count(1)
        self.daemon_version: tuple[int, int] | None = None  # as its last reply said: which fields it knows
        self._lock = threading.Lock()

    def _check_socket_access(self) -> None:
        """A socket file we may not open would only show up as a timeout; say so at once."""
        path = endpoints.ipc_path(self.endpoint)
        if path is not None and os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
            raise SocketRefusedError(f"permission denied on {path}: this user may not talk to engramd "
                                     "(the daemon's --group decides who may)")
        directory = os.path.dirname(path) if path else None
        if directory and os.path.isdir(directory) and not os.access(directory, os.X_OK):
            raise SocketRefusedError(f"permission denied on {directory}: this user may not reach engramd's "
                                     "socket (the daemon's --group decides who may)")
        if path is not None:
            check_socket_trust(path)

    def _open(self, op: str, timeout: float, deadline: float) -> zmq.Socket:
        if self._socket is not None and self._path is not None and not self._same_socket_file():
            self._reset()  # another file is at the path now (or none): never talk to it unchecked
        if self._socket is None:
            if self._path is not None:
                self._socket_file = self._wait_trusted_socket_file(op, timeout, deadline)
            sock = self._context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_REPLY_BYTES)
            if self._path is not None:
                # libzmq would reconnect by itself to whatever listens at the path later,
                # unchecked: a new listener gets a new socket, after the check above.
                sock.setsockopt(zmq.RECONNECT_IVL, -1)
            if self.curve_keys_dir is not None:
                from zmq.auth import load_certificate

                try:
                    public, secret = load_certificate(os.path.join(self.curve_keys_dir, "client.key_secret"))
                    server_public, _ = load_certificate(os.path.join(self.curve_keys_dir, "server.key"))
                except (OSError, ValueError) as exc:
                    sock.close(linger=0)
                    raise ProtocolError(f"cannot read CURVE keys in {self.curve_keys_dir}: {exc}") from exc
                sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server_public
            try:
                sock.connect(self.endpoint)
            except zmq.ZMQError as exc:
                sock.close(linger=0)
                raise ProtocolError(f"cannot connect to endpoint {self.endpoint!r}: {exc} "
                                    "(expected ipc:///path/to/socket)") from exc
            self._socket = sock
        return self._socket

    def _wait_trusted_socket_file(self, op: str, timeout: float, deadline: float) -> os.stat_result:
        """The socket file at the path once there is one and it passes the trust check; waits for
        it to appear (a daemon starting) until ``deadline``."""
        while True:
            info = check_socket_trust(self._path)
            if info is not None:
                return info
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DaemonUnavailableError(f"no engramd socket at {self._path} to ask {op!r} within {timeout:.1f} s "
                                             "(is it running? `engramd status --socket ...`)")
            time.sleep(min(FILE_POLL_S, remaining))

    def _same_socket_file(self) -> bool:
        try:
            info = os.lstat(self._path)
        except OSError:
            return False
        return endpoints.same_socket_file(info, self._socket_file)

    def _reset(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
        self._socket_file = None

    def _send(self, payload: bytes, op: str, timeout: float, deadline: float) -> zmq.Socket:
        """Queue the request on a socket connected to a checked daemon; returns that socket."""
        for _ in range(2):
            sock = self._open(op, timeout, deadline)
            try:
                sock.send(payload, zmq.NOBLOCK)
                return sock
            except zmq.Again:  # its daemon went away and it does not reconnect: check and connect anew
                self._reset()
        raise DaemonUnavailableError(f"engramd at {self.endpoint} took no {op!r} request: the connection to it "
                                     "closed as soon as it was made (is the daemon stopping?)")

    def request(self, op: str, args: dict[str, Any] | None = None, timeout: float = 5.0) -> dict[str, Any]:
        """Send one request and return its result; error replies raise their class."""
        if os.getpid() != self._owner_pid:
            raise NotAttachedError(f"this process (pid {os.getpid()}) was forked from pid {self._owner_pid}, which "
                                   f"opened this connection to engramd; a forked child must make its own EngramClient")
        with self._lock:
            deadline = time.monotonic() + timeout
            request_id = next(self._ids)
            sock = self._send(protocol.pack(protocol.request(op, request_id, args)), op, timeout, deadline)
            while True:
                if not self._await_reply(sock, op, deadline):
                    self._reset()
                    raise DaemonUnavailableError(f"engramd at {self.endpoint} did not answer {op!r} within "
                                                 f"{timeout:.1f} s (is it running? `engramd status --socket ...`)")
                frame = sock.recv(copy=False)
                if self._path is not None:
                    try:
                        check_reply_sender(self._path, _peer_address(frame), self._socket_file, op)
                    except DaemonUnavailableError:
                        self._reset()
                        raise
                reply = protocol.unpack(frame.bytes, limit=protocol.MAX_REPLY_BYTES)
                version = protocol.check_version(reply)
                if reply.get("id") == request_id:
                    self.daemon_version = version
                    break  # anything else is a stale reply to an abandoned request
        if reply.get("ok") is True:
            result = reply.get("result")
            if not isinstance(result, dict):
                raise ProtocolError(f"reply to {op!r} has no result map")
            return result
        error = reply.get("error") or {}
        cls = REPLY_ERRORS.get(error.get("name"), RequestError)
        raise cls(f"engramd refused {op!r}: {error.get('message', 'no message')}",
                  code=error.get("code"), name=error.get("name"))

    def _await_reply(self, sock: zmq.Socket, op: str, deadline: float) -> bool:
        """Whether a reply is there to read before ``deadline``.  On ipc the socket file is looked
        at every REPLY_CHECK_S: a daemon killed with SIGKILL never answers what it was asked, and
        once another file is at the path (a daemon restarted) or none is, waiting on is pointless."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            slice_s = remaining if self._path is None else min(REPLY_CHECK_S, remaining)
            if sock.poll(int(slice_s * 1000) + 1, zmq.POLLIN):
                return True
            if self._path is not None and not self._same_socket_file():
                self._reset()
                raise DaemonUnavailableError(f"the socket file at {self._path} was replaced or removed while "
                                             f"waiting for engramd's answer to {op!r}: the daemon asked is gone")

    @property
    def daemon_uid(self) -> int | None:
        """The owner of the checked socket file this connection talks through (None: not ipc, or
        not connected yet)."""
        known = self._socket_file
        return None if known is None else known.st_uid

    def close(self) -> None:
        if os.getpid() != self._owner_pid:
            self._socket = None  # the parent's: never touched here
            return
        with self._lock:
            self._reset()


def _peer_address(frame: zmq.Frame) -> str | None:
    try:
        return frame.get("Peer-Address")
    except zmq.ZMQError:
        return None
