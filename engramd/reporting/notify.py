"""systemd's readiness protocol: datagrams to $NOTIFY_SOCKET (sd_notify(3)), without libsystemd.

READY=1 is sent only when a table is served, so `Type=notify` units order ranks after a
ready table; STATUS= lines report load progress; STOPPING=1 precedes a clean stop; with
WatchdogSec= the server loop sends WATCHDOG=1 every half $WATCHDOG_USEC, so a loop that
stops turning gets the daemon restarted.  Without $NOTIFY_SOCKET every call is a no-op.

systemd waits for READY=1 (up to TimeoutStartSec=) and knows no "up, but failed".  So
under $NOTIFY_SOCKET a first load that fails ends the process: STATUS= names the reason
and the exit status is EXIT_LOAD_FAILED, which the unit's RestartPreventExitStatus= keeps
from being retried in a loop.  Outside systemd a failed daemon stays up, in state
``failed``, for ``status`` to report and ``reload`` to mend.
"""
from __future__ import annotations

import logging
import os
import socket
import time

from engram_client.core.protocol import FAILED, READY, STOPPING

from .sizes import human_pair

log = logging.getLogger("engramd.notify")
EXIT_LOAD_FAILED = 5  # the exit status of a failed first load under Type=notify; the unit names it too


class SystemdNotifier:
    def __init__(self, address: str | None = None, status_interval: float = 1.0):
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        self.address = None
        if address:
            # "@name" is an abstract-namespace socket: a leading NUL on the wire.
            self.address = "\0" + address[1:] if address.startswith("@") else address
        self.status_interval = status_interval
        self._last_status = 0.0
        self._ready_sent = False
        self._failure: str | None = None  # why the first load failed, kept for the last STATUS= line
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) if self.address else None
        usec = os.environ.get("WATCHDOG_USEC", "")
        watchdog_pid = os.environ.get("WATCHDOG_PID", "")
        for_us = not watchdog_pid or watchdog_pid == str(os.getpid())
        self.watchdog_interval = int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 and for_us else None
        self._last_watchdog = 0.0

    def send(self, *fields: str) -> None:
        if self._sock is None:
            return
        try:
            self._sock.sendto("\n".join(fields).encode(), self.address)
        except OSError as exc:  # systemd gone or the socket unwritable: never fatal to serving
            log.warning("could not notify systemd at %s: %s", self.address, exc)

    def state(self, state: str, generation: int, error: str | None = None) -> None:
        if state == READY:
            fields = [f"STATUS=ready: generation {generation}"]
            if not self._ready_sent:
                fields.insert(0, "READY=1")
                self._ready_sent = True
            self.send(*fields)
        elif state == FAILED:
            if not self._ready_sent:
                self._failure = error
            self.send(f"STATUS=load failed: {error}")
        elif state == STOPPING:
            self.send("STOPPING=1", f"STATUS=stopping: load failed: {self._failure}" if self._failure
                      else "STATUS=stopping")

    def must_exit(self, state: str) -> bool:
        """Whether ``state`` must end the process: a failed load before READY=1, under systemd."""
        return self._sock is not None and state == FAILED and not self._ready_sent

    def watchdog(self) -> None:
        """Tell systemd the loop still turns (called from the server loop; rate-limited here)."""
        if self._sock is None or self.watchdog_interval is None:
            return
        now = time.monotonic()
        if now - self._last_watchdog >= self.watchdog_interval:
            self._last_watchdog = now
            self.send("WATCHDOG=1")

    def progress(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self._sock is None or now - self._last_status < self.status_interval or not total:
            return
        self._last_status = now
        self.send(f"STATUS=loading: {human_pair(done, total)} ({100 * done / total:.1f}%)")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
