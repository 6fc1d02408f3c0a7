"""Request/reply with engramd over one DEALER socket, every wait bounded.

A request that times out closes the socket and opens a new one, so a late reply
to it can never be taken for the answer to the next request.  One lock serialises
callers (the rank's thread and the heartbeat thread share a connection).
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import zmq

from . import protocol
from .errors import REPLY_ERRORS, DaemonUnavailableError, ProtocolError, RequestError


class DaemonConnection:
    def __init__(self, endpoint: str | None = None):
        self.endpoint = endpoint or protocol.default_endpoint()
        self._context = zmq.Context.instance()
        self._socket: zmq.Socket | None = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def _open(self) -> zmq.Socket:
        if self._socket is None:
            sock = self._context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            try:
                sock.connect(self.endpoint)
            except zmq.ZMQError as exc:
                sock.close(linger=0)
                raise ProtocolError(f"cannot connect to endpoint {self.endpoint!r}: {exc} "
                                    "(expected ipc:///path/to/socket)") from exc
            self._socket = sock
        return self._socket

    def _reset(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None

    def request(self, op: str, args: dict[str, Any] | None = None, timeout: float = 5.0) -> dict[str, Any]:
        """Send one request and return its result; error replies raise their class."""
        with self._lock:
            sock = self._open()
            request_id = next(self._ids)
            sock.send(protocol.pack(protocol.request(op, request_id, args)))
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sock.poll(int(remaining * 1000) + 1, zmq.POLLIN):
                    self._reset()
                    raise DaemonUnavailableError(f"engramd at {self.endpoint} did not answer {op!r} within "
                                                 f"{timeout:.1f} s (is it running? `engramd status --socket ...`)")
                reply = protocol.unpack(sock.recv())
                protocol.check_version(reply)
                if reply.get("id") == request_id:
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

    def close(self) -> None:
        with self._lock:
            self._reset()
