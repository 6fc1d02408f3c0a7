"""Peers on the daemon's sockets that try to exhaust it or take other clients' leases.

Each test reproduces one misbehaviour with real sockets against a real daemon and checks
that the daemon's memory and descriptors stay bounded, that it keeps answering honest
peers, and that no peer can touch a lease it did not get.
"""
from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time

import pytest

from engram_client import EngramClient
from engram_client.attach.connection import DaemonConnection
from engram_client.core.errors import RequestError, UnknownClientError
from proc_stats import open_fds, rss_mib
from waiting import wait_for


BIG_SUBSCRIBER = """
import os, sys, zmq
from zmq.utils.monitor import recv_monitor_message
sub = zmq.Context().socket(zmq.XSUB)
monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
sub.connect(sys.argv[1])
sub.send(b"\\x01" + b"x" * (4 * 2**20))  # one 4 MiB subscription frame
cut = monitor.poll(20_000) and recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
print("CUT OFF" if cut else "KEPT", flush=True)
os._exit(0)  # libzmq may crash tearing down a socket it keeps reconnecting: not the daemon's concern
"""


def test_oversized_subscription_on_the_events_socket_is_cut_off(demo_daemon):
    events = demo_daemon.status()["events_endpoint"]
    before = rss_mib(demo_daemon.proc.pid)
    result = subprocess.run([sys.executable, "-c", BIG_SUBSCRIBER, events], capture_output=True, text=True,
                            timeout=120)
    assert result.stdout.strip() == "CUT OFF", result.stdout + result.stderr[-2000:]
    assert demo_daemon.status()["state"] == "ready"
    assert rss_mib(demo_daemon.proc.pid) - before < 64
    demo_daemon.proc.send_signal(signal.SIGTERM)
    assert demo_daemon.proc.wait(timeout=30) == 0


def _lower_nofile(soft: int, hard: int):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_connections_past_the_descriptor_limit_are_refused_not_fatal(socket_dir, shm_dir):
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    log_path = os.path.join(socket_dir, "engramd.log")
    with open(log_path, "wb") as log:
        daemon = subprocess.Popen([sys.executable, "-m", "engramd", "serve", "--socket", endpoint, "--shm-dir",
                                   shm_dir, "--no-progress"], stdout=log, stderr=subprocess.STDOUT,
                                  preexec_fn=_lower_nofile(256, 4096))
    honest = DaemonConnection(endpoint)
    flood: list[socket.socket] = []
    try:
        wait_for(lambda: _ready(honest), "the daemon to serve its table", 60)
        path = endpoint[len("ipc://"):]
        for _ in range(1500):  # past the soft limit (256) it starts with, and the peer cap (1024) under the hard one
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(path)
            except OSError:
                conn.close()
                break
            flood.append(conn)
        time.sleep(2.0)
        assert daemon.poll() is None, open(log_path).read()[-3000:]
        assert honest.request("status", timeout=10)["state"] == "ready"  # connected before the flood
        wait_for(lambda: open_fds(daemon.pid) < 1024 + 200, "the daemon to disconnect the peers past its cap", 30)
        for conn in flood:
            conn.close()
        flood.clear()
        late = DaemonConnection(endpoint)
        try:
            assert wait_for(lambda: _ready(late), "a new peer to be served after the flood", 30)
        finally:
            late.close()
        assert "refused a connection" in open(log_path).read()
    finally:
        for conn in flood:
            conn.close()
        honest.close()
        daemon.terminate()
        daemon.wait(timeout=30)


def _ready(connection: DaemonConnection) -> bool:
    try:
        return connection.request("status", timeout=2)["state"] == "ready"
    except Exception:
        return False


def test_attach_fields_are_bounded(demo_daemon):
    with pytest.raises(RequestError, match="device"):
        demo_daemon.connection.request("attach", {"pid": 1, "device": "cuda:" + "0" * 200})


def test_a_peer_cannot_detach_or_renew_another_clients_lease(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cpu", timeout=30) as client:
        public_id = demo_daemon.status()["clients"][0]["id"]
        assert public_id == client.client_id
        thief = DaemonConnection(demo_daemon.endpoint)
        try:
            with pytest.raises(UnknownClientError):
                thief.request("detach", {"client_id": public_id})
            with pytest.raises(UnknownClientError):
                thief.request("heartbeat", {"client_id": public_id, "secret": "0" * 32})
        finally:
            thief.close()
        assert [c["id"] for c in demo_daemon.status()["clients"]] == [public_id]
    wait_for(lambda: demo_daemon.status()["clients"] == [], "the owner's own detach", 10)


def test_lease_ids_do_not_repeat_across_restarts(daemon_factory):
    ids = []
    for _ in range(2):
        daemon = daemon_factory()
        daemon.wait_state("ready")
        ids.append(daemon.connection.request("attach", {"pid": 777, "host": "h", "device": "cpu"})["client_id"])
        daemon.kill()
        daemon.connection.close()
    assert ids[0] != ids[1]


def test_reload_path_with_nul_is_a_bad_request(demo_daemon):
    with pytest.raises(RequestError) as caught:
        demo_daemon.connection.request("reload", {"checkpoint": "/tmp/a\0b"})
    assert caught.value.code == "bad_request"
    assert demo_daemon.status()["state"] == "ready"
