"""The daemon's ZeroMQ front: a ROUTER for requests, a PUB for state events.

Both are Unix sockets the daemon accepts on itself and speaks ZMTP on, playing the ROUTER
and the PUB (wire/: what a peer can make it hold is bounded in bytes, a peer past the
bounds is cut, and connections are kept in all and per user as wire/places.py says).  The
optional TCP status socket is libzmq's, with CURVE (remote_status.py).  One thread owns
the sockets.  It polls with a short timeout so that leases
expire, stop requests and signals are noticed, and state events queued by the
load thread are published, even when no request arrives.  Every request gets
exactly one reply; the mapping from exceptions to error replies happens here and
nowhere else.  Frames that cannot be answered (no routing identity) are dropped.
What peers make the daemon log is clipped and rate-limited (log_limit.py).

Owns the sockets and the socket files; the table belongs to daemon/state_machine.py.
"""
from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import socket
import sys

import zmq

from engram_client.core import endpoints, protocol
from engram_client.core.errors import ConfigError, EngramError, ProtocolError
from engram_client.core.protocol import LOADING

from .config import ServeConfig
from .state_machine import Daemon
from .ops import OPERATIONS
from ..guards.fd_limits import PeerCap, peer_budget, raise_nofile_limit
from .gather_budget import serve_budget
from ..guards.lease_limits import Holder
from ..guards.log_limit import LogLimiter, clip
from ..guards.endpoint_lock import EndpointLock, warn_if_group_cannot_pass
from ..guards.memory_trim import HeapTrimmer
from ..reporting.progress import progress_for
from ..reporting.metrics import NO_OPERATION, Metrics, NoMetrics
from ..reporting.notify import EXIT_LOAD_FAILED, SystemdNotifier
from .remote_status import RemoteStatus
from ..guards.safe_paths import check_bind_path, same_file_at
from ..wire import EventEndpoint, Places, RequestEndpoint, listen
from ..wire.bounds import HANDSHAKE_S, RESERVED_PLACES

log = logging.getLogger("engramd.server")
POLL_MS = 100
DRAIN_PER_POLL = 256  # answer at most this many requests before housekeeping runs again
# A connection that sent nothing for this many lease lengths, and holds nothing, is cut: a rank
# heartbeats three times a lease, and leases outlive connections, so no rank loses anything.
IDLE_LEASES = 3
REMOTE_PEERS = 64  # TCP status peers (a few monitoring hosts), handshaken or not, out of the descriptors' places


class Server:
    def __init__(self, config: ServeConfig):
        # Exercise the serializer once so a broken msgpack fails at start, not at the first request.
        assert_roundtrip = protocol.unpack(protocol.pack(protocol.request("status", 0)))
        if assert_roundtrip.get("op") != "status":
            raise ProtocolError("msgpack round-trip self-check failed")
        self.config = config
        self.lock = EndpointLock(config.endpoint, config.gid)
        self.events: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.context = zmq.Context()
        self.router = self.pub = self.remote = self.peer_cap = self.budget = None
        self._bound: dict[str, os.stat_result] = {}  # socket path -> lstat of the file we bound (same_file_at)
        self.exit_code = 0
        try:
            soft_limit, _ = raise_nofile_limit()
            peers = peer_budget(soft_limit)  # refuses a limit too low to serve, before anything is bound
            self.metrics = Metrics() if config.metrics_port is not None else NoMetrics()
            self.daemon = Daemon(config, on_state_change=self.events.put, metrics=self.metrics)
            remote_peers = min(REMOTE_PEERS, max(1, peers // 4)) if config.remote_status else 0
            self.places = Places(peers - remote_peers, trusted=frozenset({0, os.geteuid()}))
            self.router = self._listen(config.endpoint)  # plays the ROUTER (wire/requests.py)
            self.pub = self._listen(config.events_endpoint)  # plays the PUB (wire/events.py)
            self.notes = LogLimiter(log)
            idle_s = max(HANDSHAKE_S, IDLE_LEASES * config.lease_seconds)
            self.requests = RequestEndpoint(self.router, endpoints.ipc_path(config.endpoint), self.notes,
                                            self.places, idle_s)
            self.publisher = EventEndpoint(self.pub, endpoints.ipc_path(config.events_endpoint), self.notes,
                                           self.places, idle_s)
            self.budget = self.daemon.budget = serve_budget(config, self.daemon.boot_id)  # gather_budget.py
            log.info("open-file limit %d: at most %d peers at once, %d of one user (root and this user: %d more)",
                     soft_limit, self.places.limit, self.places.per_user, RESERVED_PLACES)
            if config.metrics_port is not None:
                self.metrics.watch(self.daemon)
                try:
                    self.metrics.serve(config.metrics_port, config.metrics_address)
                except OSError as exc:
                    raise ConfigError(f"cannot serve metrics on {config.metrics_address}:{config.metrics_port}: "
                                      f"{exc.strerror}") from exc
                log.info("metrics on http://%s:%d/metrics", config.metrics_address, config.metrics_port)
            if config.remote_status:
                self.remote = RemoteStatus(self.context, config.remote_status, config.curve_keys_dir)
                self.peer_cap = PeerCap(remote_peers)  # counts its connections, handshaken or not
                self.peer_cap.watch(self.remote.socket)
                log.info("remote status on %s (CURVE, keys in %s; at most %d peers)", config.remote_status,
                         config.curve_keys_dir, remote_peers)
        except BaseException:
            self._close_sockets()
            if hasattr(self, "daemon"):
                self.daemon.close()
            self.lock.release()
            raise
        self.progress = progress_for(sys.stderr, config.progress_bar)
        self.notifier = SystemdNotifier()
        self.heap = HeapTrimmer()

    def _listen(self, endpoint: str) -> socket.socket:
        path = endpoints.ipc_path(endpoint)  # config.py admits ipc:// endpoints only
        check_bind_path(path, "socket")  # binding replaces whatever stands at the path
        old_umask = os.umask(0o077)  # the socket file is created owner-only, then opened to --group
        try:
            sock = listen(path)
        except OSError as exc:
            raise ConfigError(f"cannot bind {endpoint}: {exc.strerror}") from exc
        finally:
            os.umask(old_umask)
        try:
            self._set_up_socket_file(path)
        except BaseException as exc:
            sock.close()  # not yet one of self's sockets
            self._unlink_socket_file(path)
            if isinstance(exc, OSError):
                raise ConfigError(f"cannot give the socket {path} its group and mode: "
                                  f"{exc.filename or path}: {exc.strerror}") from exc
            raise
        return sock

    def _set_up_socket_file(self, path: str) -> None:
        gid = self.config.gid
        try:
            if gid is not None:
                os.chown(path, -1, gid)
                directory = os.path.dirname(path) or "."
                if directory != (os.path.dirname(endpoints.ipc_path(self.config.endpoint)) or "."):
                    warn_if_group_cannot_pass(directory, gid)  # an --events-socket elsewhere: never ours to re-mode
            os.chmod(path, 0o660 if gid is not None else 0o600)
        finally:  # after chown and chmod, which change the ctime the file is known by (same_file_at)
            self._bound[path] = os.lstat(path)

    def _unlink_socket_file(self, path: str) -> None:
        """Remove the socket file we bound, never a file that took its place."""
        if same_file_at(path, self._bound.pop(path, None)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    # -- request handling --------------------------------------------------------------
    def handle(self, frames: list[bytes], allowed: tuple[str, ...] | None = None,
               peer: Holder | None = None) -> list[bytes] | None:
        """One request's frames in, the reply's frames out (None: drop, cannot be answered).
        ``peer``: who sent it, as the kernel told (default: the routing identity alone)."""
        if len(frames) < 2:
            return None
        identity, body = frames[0], frames[1:]
        envelope = [identity]
        if body[0] == b"" and len(body) >= 2:  # REQ framing: an empty delimiter first
            envelope, body = [identity, b""], body[1:]
        request_id, op = None, NO_OPERATION
        try:
            if len(body) != 1:
                raise ProtocolError(f"expected exactly one payload frame, got {len(body)}")
            message = protocol.unpack(body[0])
            request_id = message.get("id") if isinstance(message.get("id"), (int, str)) else None
            request_id, op, args = protocol.parse_request(message)
            if allowed is not None and op not in allowed:
                raise ProtocolError(f"operation {op!r} is not served on this endpoint (only {', '.join(allowed)})")
            reply = protocol.ok_reply(request_id, OPERATIONS[op].execute(self.daemon, args,
                                                                         peer=peer or Holder(identity)))
            self.metrics.requests.labels(op=op).inc()
        except EngramError as exc:
            self.metrics.errors.labels(op=op, code=exc.code).inc()
            self.notes.warning(f"refused requests ({exc.code})", "refused request %s: %s: %s",
                               clip(repr(request_id), 64), type(exc).__name__, clip(str(exc)))
            reply = protocol.error_reply(request_id, exc.code, type(exc).__name__, str(exc))
        except Exception as exc:  # a bug in a handler must not take the daemon down
            self.metrics.errors.labels(op=op, code="internal").inc()
            self.notes.log(logging.ERROR, "requests failed inside the daemon", "request %s failed inside the daemon",
                           clip(repr(request_id), 64), exc_info=True)
            reply = protocol.error_reply(request_id, "internal", type(exc).__name__, f"internal error: {exc}")
        return envelope + [protocol.pack(reply)]

    def _drain(self, sock: zmq.Socket, allowed: tuple[str, ...] | None = None) -> None:
        for _ in range(DRAIN_PER_POLL):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            reply = self.handle(frames, allowed)
            if reply is not None:
                try:
                    sock.send_multipart(reply, zmq.NOBLOCK)
                except zmq.ZMQError as exc:  # the peer went away or its queue is full
                    self.notes.warning("replies not sent", "could not send a reply: %s", exc)

    def _answer(self) -> None:
        for peer, frames in self.requests.requests(DRAIN_PER_POLL):
            reply = self.handle([peer.identity, *frames], peer=Holder(peer.identity, peer.pid, peer.uid))
            if reply is not None:
                self.requests.reply(peer, reply[1:])

    def _poll_ms(self) -> float:
        """POLL_MS, or less while some peer's output waits for libzmq to take it."""
        waits = [wait for wait in (self.requests.wait_s(), self.publisher.wait_s()) if wait is not None]
        return min([POLL_MS] + [wait * 1000 for wait in waits])

    def _publish_events(self) -> None:
        while True:
            try:
                state = self.events.get_nowait()
            except queue.Empty:
                return
            event = protocol.state_event(state, self.daemon.generation, self.daemon.boot_id)
            self.publisher.publish([protocol.pack(event)])
            self.notifier.state(state, self.daemon.generation, self.daemon.error)
            if self.notifier.must_exit(state):
                log.error("the first load failed under systemd (Type=notify), which waits for READY=1: exiting with "
                          "status %d so that the unit fails now (%s)", EXIT_LOAD_FAILED, self.daemon.error)
                self.exit_code = EXIT_LOAD_FAILED
                self.daemon.request_stop()

    # -- main loop ---------------------------------------------------------------------
    def serve_forever(self) -> int:
        def on_signal(signum, _frame):
            log.info("received %s; stopping", signal.Signals(signum).name)
            self.daemon.request_stop()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            log.info("engramd serving %s (events %s), boot %s", self.config.endpoint,
                     self.config.events_endpoint, self.daemon.boot_id)
            self.daemon.start_load()
            poller = zmq.Poller()
            # Each endpoint's epoll set (connections, bytes, room for output), by descriptor: that is
            # what the poller reports for anything that is not a ZeroMQ socket.
            poller.register(self.requests.fileno(), zmq.POLLIN)
            poller.register(self.publisher.fileno(), zmq.POLLIN)
            if self.remote is not None:
                poller.register(self.remote.socket, zmq.POLLIN)
                for monitor in self.peer_cap.monitors:
                    poller.register(monitor, zmq.POLLIN)
            while not self.daemon.stop_is_requested():
                ready = dict(poller.poll(self._poll_ms()))
                if self.requests.fileno() in ready:
                    self.requests.read()
                if self.publisher.fileno() in ready:
                    self.publisher.read()
                self._answer()
                self.requests.flush()
                self.publisher.flush()
                self.notes.flush()
                if self.remote is not None and self.remote.socket in ready:
                    self._drain(self.remote.socket, allowed=("status",))
                if self.peer_cap is not None:
                    self.peer_cap.poll()
                self.daemon.housekeeping()
                self.notifier.watchdog()
                self.heap.maybe_trim()
                self._publish_events()
                if self.daemon.state == LOADING:
                    load = self.daemon.load_progress()
                    self.notifier.progress(load["done_bytes"], load["total_bytes"])
                self.progress.watch(self.daemon.loading_generation())
            self.progress.close()
            self.daemon.shutdown()
            self._publish_events()
            return self.exit_code
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._close_sockets()
            self.notifier.close()
            self.lock.release()
            log.info("engramd stopped")

    def _close_sockets(self) -> None:
        if self.budget is not None:
            self.budget.close()
            self.budget = None
        if self.peer_cap is not None:
            self.peer_cap.close()  # before the sockets it monitors, or the context never terminates
            self.peer_cap = None
        if self.remote is not None:
            self.remote.close()
            self.remote = None
        for name, sock, endpoint in (("requests", self.router, self.config.endpoint),
                                     ("publisher", self.pub, self.config.events_endpoint)):
            if sock is None:
                continue
            if hasattr(self, name):
                getattr(self, name).stop()  # its peers, and the listening socket
            else:
                sock.close()
            self._unlink_socket_file(endpoints.ipc_path(endpoint))
        self.context.destroy(linger=0)  # closes any socket still open, so terminating never blocks
