"""The daemon's ZeroMQ front: a ROUTER for requests, a PUB for state events.

One thread owns both sockets.  It polls with a short timeout so that leases
expire, stop requests and signals are noticed, and state events queued by the
load thread are published, even when no request arrives.  Every request gets
exactly one reply; the mapping from exceptions to error replies happens here and
nowhere else.  Frames that cannot be answered (no routing identity) are dropped.

Owns the sockets and the socket files; the table belongs to daemon.py.
"""
from __future__ import annotations

import logging
import os
import queue
import signal
import sys
import time

import zmq

from engram_client.core import endpoints, protocol
from engram_client.core.errors import ConfigError, EngramError, ProtocolError
from engram_client.core.protocol import LOADING

from .config import ServeConfig
from .daemon import Daemon
from .ops import OPERATIONS
from .fd_limits import PeerCap, peer_budget, raise_nofile_limit
from .gather_budget import GatherBudget, plan_groups
from .lock_owner import holder, write_pid
from .memory_trim import HeapTrimmer
from .progress import progress_for
from .metrics import Metrics, NoMetrics
from .notify import SystemdNotifier
from .remote_status import RemoteStatus
from .safe_paths import prepare_socket_dir, take_lock

log = logging.getLogger("engramd.server")
POLL_MS = 100
DRAIN_PER_POLL = 256  # answer at most this many requests before housekeeping runs again
HANDSHAKE_MS = 5000
REPLY_QUEUE = 256  # replies queued per peer: a client may pipeline this many requests and read them all
REQUEST_QUEUE = 16  # requests taken in per peer before it has to wait


class EndpointLock:
    """An flock beside an ipc socket: binding would silently steal a live daemon's path."""

    def __init__(self, endpoint: str):
        self.path = None
        self.fd = -1
        socket_path = endpoints.ipc_path(endpoint)
        if socket_path is None:
            return
        directory = os.path.dirname(socket_path) or "."
        prepare_socket_dir(directory, default=endpoint == endpoints.default_endpoint())
        self.path = socket_path + ".lock"
        self.fd = take_lock(self.path, "socket lock", lambda: (
            f"another engramd{holder(self.path)} is serving {endpoint}; "
            f"stop it first: engramd stop --socket {endpoint}"))
        write_pid(self.fd)

    def release(self) -> None:
        if self.fd >= 0:
            os.unlink(self.path)
            os.close(self.fd)
            self.fd = -1


class Server:
    def __init__(self, config: ServeConfig):
        # Exercise the serializer once so a broken msgpack fails at start, not at the first request.
        assert_roundtrip = protocol.unpack(protocol.pack(protocol.request("status", 0)))
        if assert_roundtrip.get("op") != "status":
            raise ProtocolError("msgpack round-trip self-check failed")
        self.config = config
        self.lock = EndpointLock(config.endpoint)
        self.events: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.context = zmq.Context()
        self.router = self.pub = self.remote = self.peer_cap = self.budget = None
        try:
            soft_limit, _ = raise_nofile_limit()
            self.metrics = Metrics() if config.metrics_port is not None else NoMetrics()
            self.daemon = Daemon(config, on_state_change=self.events.put, metrics=self.metrics)
            self.router = self._bind(zmq.ROUTER, config.endpoint)
            self.pub = self._bind(zmq.PUB, config.events_endpoint)
            self.budget = self._gather_budget()  # node budget hook (engramd/gather_budget.py)
            self.peer_cap = PeerCap(peer_budget(soft_limit))
            self.peer_cap.watch(self.router)
            self.peer_cap.watch(self.pub)
            log.info("open-file limit %d: at most %d peers at once", soft_limit, self.peer_cap.limit)
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
                log.info("remote status on %s (CURVE, keys in %s)", config.remote_status, config.curve_keys_dir)
        except BaseException:
            self._close_sockets()
            if hasattr(self, "daemon"):
                self.daemon.close()
            self.lock.release()
            raise
        self.progress = progress_for(sys.stderr, config.progress_bar)
        self.notifier = SystemdNotifier()
        self.heap = HeapTrimmer()

    def _gather_budget(self) -> GatherBudget | None:
        """The node's gather budget, served beside the request socket (ipc endpoints only)."""
        groups = plan_groups(self.config.gather_cpus)
        path = endpoints.ipc_path(self.config.endpoint)
        if not groups or path is None:
            log.info("no gather budget (%s): each rank sizes its own pool",
                     "--gather-cpus off" if not groups else "not an ipc endpoint")
            return None
        budget = GatherBudget(groups, path + ".budget", self.config.gid, self.daemon.boot_id)
        self.daemon.budget = budget
        return budget

    def _bind(self, kind: int, endpoint: str) -> zmq.Socket:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        # Set before bind: the listener hands its options to each connection it accepts.
        # Per peer: a ROUTER drops replies to a peer with REPLY_QUEUE of them unread and a PUB
        # drops events, so a peer that never reads costs at most that many messages; a peer
        # that sends faster than it is answered waits on its own socket (REQUEST_QUEUE).
        sock.setsockopt(zmq.SNDHWM, REPLY_QUEUE)
        sock.setsockopt(zmq.RCVHWM, REQUEST_QUEUE)
        # Both sockets: a PUB receives its subscribers' subscription frames, which are as
        # much a peer's input as requests are.
        sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_REQUEST_BYTES)
        # A connection that never completes the ZMTP handshake holds a descriptor: not for long.
        sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
        path = endpoints.ipc_path(endpoint)
        old_umask = os.umask(0o077)  # the socket file is created owner-only, then opened to --group
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            sock.close()
            raise ConfigError(f"cannot bind {endpoint}: {exc}") from exc
        finally:
            os.umask(old_umask)
        if path is not None:
            gid = self.config.gid
            if gid is not None:
                os.chown(path, -1, gid)
                directory = os.path.dirname(path)
                if os.stat(directory).st_uid == os.getuid():
                    os.chown(directory, -1, gid)
                    os.chmod(directory, 0o750)
            os.chmod(path, 0o660 if gid is not None else 0o600)
        return sock

    # -- request handling --------------------------------------------------------------
    def handle(self, frames: list[bytes], allowed: tuple[str, ...] | None = None) -> list[bytes] | None:
        """One request's frames in, the reply's frames out (None: drop, cannot be answered)."""
        if len(frames) < 2:
            return None
        identity, body = frames[0], frames[1:]
        envelope = [identity]
        if body[0] == b"" and len(body) >= 2:  # REQ framing: an empty delimiter first
            envelope, body = [identity, b""], body[1:]
        request_id = None
        try:
            if len(body) != 1:
                raise ProtocolError(f"expected exactly one payload frame, got {len(body)}")
            message = protocol.unpack(body[0])
            request_id = message.get("id") if isinstance(message.get("id"), (int, str)) else None
            request_id, op, args = protocol.parse_request(message)
            if allowed is not None and op not in allowed:
                raise ProtocolError(f"operation {op!r} is not served on this endpoint (only {', '.join(allowed)})")
            reply = protocol.ok_reply(request_id, OPERATIONS[op].execute(self.daemon, args, peer=identity))
            self.metrics.requests.labels(op=op).inc()
        except EngramError as exc:
            self.metrics.errors.labels(code=exc.code).inc()
            log.warning("refused request %r: %s: %s", request_id, type(exc).__name__, exc)
            reply = protocol.error_reply(request_id, exc.code, type(exc).__name__, str(exc))
        except Exception as exc:  # a bug in a handler must not take the daemon down
            self.metrics.errors.labels(code="internal").inc()
            log.exception("request %r failed inside the daemon", request_id)
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
                    log.warning("could not send a reply: %s", exc)

    def _publish_events(self) -> None:
        while True:
            try:
                state = self.events.get_nowait()
            except queue.Empty:
                return
            event = protocol.state_event(state, self.daemon.generation, self.daemon.boot_id)
            self.pub.send(protocol.pack(event))
            self.notifier.state(state, self.daemon.generation, self.daemon.error)

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
            poller.register(self.router, zmq.POLLIN)
            for monitor in self.peer_cap.monitors:
                poller.register(monitor, zmq.POLLIN)
            if self.remote is not None:
                poller.register(self.remote.socket, zmq.POLLIN)
            while not self.daemon.stop_is_requested():
                ready = dict(poller.poll(POLL_MS))
                if self.router in ready:
                    self._drain(self.router)
                if self.remote is not None and self.remote.socket in ready:
                    self._drain(self.remote.socket, allowed=("status",))
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
            time.sleep(0.05)  # let the last 'stopping' event leave the PUB socket
            return 0
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
        for sock, endpoint in ((self.router, self.config.endpoint), (self.pub, self.config.events_endpoint)):
            if sock is None:
                continue
            sock.close(linger=0)
            path = endpoints.ipc_path(endpoint)
            if path is not None:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        self.context.term()
