"""One client process of benchmarks/daemon/load_clients.py: attach, heartbeat on its own connection, poll status, detach.

It speaks the protocol through engram_client.attach.connection.DaemonConnection only, so it
never imports torch (it reports whether it did).
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time

from engram_client.attach.connection import DaemonConnection
from engram_client.core.errors import DaemonUnavailableError, EngramError, UnknownClientError

START_TIMEOUT_S = 120.0  # attach, and the wait for every client to be attached


def _heartbeats(endpoint: str, state: dict, interval: float, timeout: float, stop: threading.Event) -> None:
    connection = DaemonConnection(endpoint)
    try:
        while not stop.wait(interval):
            started = time.perf_counter()
            try:
                connection.request("heartbeat", {"client_id": state["client_id"], "secret": state["secret"]},
                                   timeout=timeout)
                state["heartbeats"] += 1
                state["heartbeat_latencies"].append(time.perf_counter() - started)
            except UnknownClientError:
                state["unknown_client"] += 1
                try:  # as EngramClient does: attach again, and go on
                    reply = connection.request("attach", state["attach_args"], timeout=timeout)
                    state["client_id"], state["secret"] = reply["client_id"], reply["lease_secret"]
                except DaemonUnavailableError:
                    state["unanswered"]["attach"] += 1
                except EngramError as exc:
                    state["errors"].append(f"re-attach: {exc}")
            except DaemonUnavailableError:
                state["unanswered"]["heartbeat"] += 1
            except EngramError as exc:
                state["errors"].append(f"heartbeat: {exc}")
    finally:
        connection.close()


def client_main(index: int, endpoint: str, seconds: float, timeout: float, interval: float, ready, go, release,
                results) -> None:
    """One client process; everything it has to say goes on ``ready`` and ``results``."""
    state = {"index": index, "pid": os.getpid(), "client_id": None, "heartbeats": 0, "heartbeat_latencies": [],
             "unknown_client": 0, "unanswered": {"status": 0, "heartbeat": 0, "attach": 0, "detach": 0},
             "status_latencies": [], "errors": [], "torch_imported": False,
             "attach_args": {"pid": os.getpid(), "host": socket.gethostname(), "rank": index, "device": "cpu"}}
    connection = DaemonConnection(endpoint)
    stop = threading.Event()
    heartbeat = None
    try:
        try:
            reply = connection.request("attach", state["attach_args"], timeout=timeout)
        except DaemonUnavailableError:
            state["unanswered"]["attach"] += 1
            raise
        state["client_id"], state["secret"] = reply["client_id"], reply["lease_secret"]
        heartbeat = threading.Thread(target=_heartbeats, name="heartbeat", daemon=True,
                                     args=(endpoint, state, reply["lease_seconds"] / 3, timeout, stop))
        heartbeat.start()
        ready.put((index, state["client_id"], None))
        if not go.wait(START_TIMEOUT_S):
            raise TimeoutError(f"client {index}: no start signal within {START_TIMEOUT_S} s")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                status = connection.request("status", timeout=timeout)
                state["status_latencies"].append(time.perf_counter() - started)
                if status.get("state") != "ready":
                    state["errors"].append(f"status state {status.get('state')}")
            except DaemonUnavailableError:
                state["unanswered"]["status"] += 1
            if interval:
                time.sleep(interval)
        state["torch_imported"] = "torch" in sys.modules
        results.put({key: value for key, value in state.items() if key not in ("attach_args", "secret")})
        if not release.wait(START_TIMEOUT_S + seconds):  # keep the lease until the main process has looked
            raise TimeoutError(f"client {index}: no release signal")
        stop.set()
        heartbeat.join(timeout=timeout + 1)
        try:
            connection.request("detach", {"client_id": state["client_id"], "secret": state["secret"]}, timeout=timeout)
        except DaemonUnavailableError:
            results.put({"index": index, "late_unanswered": "detach"})
        except UnknownClientError:
            results.put({"index": index, "late_lost": "detach"})
    except BaseException as exc:  # reported, never silent
        ready.put((index, None, f"{type(exc).__name__}: {exc}"))
        results.put({"index": index, "fatal": f"{type(exc).__name__}: {exc}"})
    finally:
        stop.set()
        connection.close()


