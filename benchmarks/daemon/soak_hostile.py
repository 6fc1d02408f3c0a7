"""Honest clients beside misbehaving peers, for minutes: does the daemon stay bounded and exact?

    python -m benchmarks.daemon.soak_hostile [--seconds 600] [--clients 8] [--json FILE]

Starts a daemon on the demo table (temporary socket and shm dirs), then runs side by side:

- ``--clients`` honest processes: each an EngramClient (CPU) looking up random ids back to
  back and comparing every row bit for bit with the independent numpy reference; each
  reports lookups, mismatches and whether its lease id ever changed (a lost lease);
- misbehaving peers, in turns: a 4 MiB subscription frame on the events socket; a flood of
  raw connections that never handshake; a connection attaching until refused and then
  leaving its leases to expire; DEALERs sending 1,000 status requests each and never
  reading; a thief detaching and renewing the leases status lists; a reload path with NUL.

Every 5 s it samples the daemon's RSS and open descriptors.  Exit status 0 only if every
honest lookup was exact, no honest lease was lost, and the daemon never died.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import zmq

from benchmarks.common import write_json
from engram_client.core import protocol
from engram_client.attach.connection import DaemonConnection
from engram_client.core.errors import EngramError
from engram_client.attach.readiness import wait_ready
from engram_client.tools.serve_process import launch_serve

SAMPLE_S = 5.0
BIG_SUBSCRIBER = (
    "import os, sys, zmq\n"
    "s = zmq.Context().socket(zmq.XSUB); s.connect(sys.argv[1])\n"
    "s.send(b'\\x01' + b'x' * (4 * 2**20)); import time; time.sleep(3); os._exit(0)\n")


def honest_client(endpoint: str, seconds: float, results) -> None:
    import torch

    from engram_client import EngramClient
    from engram_client.core.demo_rows import demo_rows
    from engram_client.lookup.reference import reference_bf16_bits, same_bf16

    report = {"pid": os.getpid(), "lookups": 0, "rows": 0, "mismatches": 0, "lease_changes": 0, "errors": []}
    try:
        with EngramClient(endpoint=endpoint, device="cpu", timeout=60) as client:
            lease, rng = client.client_id, np.random.default_rng(os.getpid())
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                layer = client.layers[report["lookups"] % len(client.layers)]
                table = client.table(layer)
                ids = rng.integers(0, table.num_rows, 256)
                out = table.lookup(torch.from_numpy(ids))
                weight, scale = demo_rows(0, layer, ids, table.head_dim)
                actual = out.contiguous().view(torch.int16).numpy().view(np.uint16)
                if not same_bf16(actual.reshape(-1, table.head_dim), reference_bf16_bits(weight, scale)).all():
                    report["mismatches"] += 1
                report["lookups"] += 1
                report["rows"] += ids.size
                if client.client_id != lease:
                    report["lease_changes"] += 1
                    lease = client.client_id
                time.sleep(0.01)
            report["attached_at_end"] = client.attached
    except Exception as exc:  # reported, never silent
        report["errors"].append(f"{type(exc).__name__}: {exc}")
    results.put(report)


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except (EngramError, OSError, zmq.ZMQError, subprocess.SubprocessError):
        pass


def big_subscription(endpoint: str, events: str) -> None:
    subprocess.run([sys.executable, "-c", BIG_SUBSCRIBER, events], capture_output=True, timeout=60)


def connection_flood(endpoint: str, events: str) -> None:
    path, conns = endpoint[len("ipc://"):], []
    try:
        for _ in range(600):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(path)
            conns.append(conn)
        time.sleep(3)
    finally:
        for conn in conns:
            conn.close()


def lease_hog(endpoint: str, events: str) -> None:
    context = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        for n in range(40):
            sock.send(protocol.pack(protocol.request("attach", n, {"pid": 1, "host": "h" * 250, "device": "cpu"})))
            if not sock.poll(5000):
                break
            sock.recv()
    finally:
        sock.close(linger=0)


def deaf_peers(endpoint: str, events: str) -> None:
    context = zmq.Context.instance()
    payloads = [protocol.pack(protocol.request("status", i)) for i in range(1000)]
    socks = []
    try:
        for _ in range(10):
            sock = context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(endpoint)
            socks.append(sock)
            for payload in payloads:
                sock.send(payload)
        time.sleep(3)
    finally:
        for sock in socks:
            sock.close(linger=0)


def thief(endpoint: str, events: str) -> None:
    connection = DaemonConnection(endpoint)
    try:
        for client in connection.request("status", timeout=10)["clients"]:
            _quietly(connection.request, "detach", {"client_id": client["id"]})
            _quietly(connection.request, "heartbeat", {"client_id": client["id"], "secret": "0" * 32})
        _quietly(connection.request, "reload", {"checkpoint": "/tmp/a\0b"})
    finally:
        connection.close()


ATTACKS = (big_subscription, connection_flood, lease_hog, deaf_peers, thief)


def daemon_sample(pid: int) -> dict:
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return {"t": round(time.monotonic(), 1), "rss_mib": round(rss / 1024, 1), "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def run(args) -> dict:
    socket_dir, shm_dir = tempfile.mkdtemp(prefix="soak-"), tempfile.mkdtemp(prefix="soak-", dir="/dev/shm")
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    log = open(os.path.join(socket_dir, "engramd.log"), "wb")
    daemon = launch_serve(endpoint, shm_dir, log_level="info", output=log)
    attacks = {attack.__name__: 0 for attack in ATTACKS}
    samples = []
    try:
        probe = DaemonConnection(endpoint)
        status = wait_ready(probe, 60.0, daemon=daemon)
        events = status["events_endpoint"]
        results = mp.get_context("spawn").Queue()
        clients = [mp.get_context("spawn").Process(target=honest_client, args=(endpoint, args.seconds, results))
                   for _ in range(args.clients)]
        for client in clients:
            client.start()
        started = time.monotonic()
        samples.append(daemon_sample(daemon.pid))
        next_sample, turn = started + SAMPLE_S, 0
        while time.monotonic() - started < args.seconds and daemon.poll() is None:
            attack = ATTACKS[turn % len(ATTACKS)]
            _quietly(attack, endpoint, events)
            attacks[attack.__name__] += 1
            turn += 1
            if time.monotonic() >= next_sample:
                samples.append(daemon_sample(daemon.pid))
                next_sample += SAMPLE_S
        reports = [results.get(timeout=120 + args.seconds) for _ in clients]
        for client in clients:
            client.join(timeout=30)
        alive = daemon.poll() is None
        if alive:
            samples.append(daemon_sample(daemon.pid))
        probe.close()
    finally:
        if daemon.poll() is None:
            daemon.terminate()
            daemon.wait(timeout=60)
        log.close()
        shutil.rmtree(shm_dir, ignore_errors=True)
    rss, fds = [s["rss_mib"] for s in samples], [s["fds"] for s in samples]
    summary = {
        "seconds": args.seconds, "honest_clients": args.clients, "attack_rounds": attacks,
        "daemon_alive_throughout": alive,
        "honest_lookups": sum(r["lookups"] for r in reports), "honest_rows": sum(r["rows"] for r in reports),
        "mismatched_lookups": sum(r["mismatches"] for r in reports),
        "leases_lost": sum(r["lease_changes"] for r in reports) + sum(not r.get("attached_at_end") for r in reports),
        "client_errors": [e for r in reports for e in r["errors"]],
        "rss_mib": {"start": rss[0], "max": max(rss), "end": rss[-1]},
        "fds": {"start": fds[0], "max": max(fds), "end": fds[-1]},
        "samples": samples,
        "log": os.path.join(socket_dir, "engramd.log"),
    }
    summary["ok"] = (alive and summary["mismatched_lookups"] == 0 and summary["leases_lost"] == 0
                     and not summary["client_errors"] and summary["honest_lookups"] > 0)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=600.0, help="how long to run [600]")
    parser.add_argument("--clients", type=int, default=8, help="honest client processes [8]")
    parser.add_argument("--json", default=None, help="also write the summary here")
    args = parser.parse_args()
    if args.seconds <= 0 or args.clients < 1:
        parser.error("--seconds and --clients must be positive")
    summary = run(args)
    write_json(args.json, summary)
    for key, value in summary.items():
        if key != "samples":
            print(f"{key:26} {value}")
    sys.exit(0 if summary["ok"] else 1)


if __name__ == "__main__":
    main()
