"""A ZMTP 3.0 peer made of a plain AF_UNIX socket and the standard library.

It does what libzmq's own sockets never do (frames flagged MORE forever, subscriptions of
any size, requests it never reads the answers to) and, needing neither pyzmq nor msgpack,
runs as another user on the system's Python.  Run as a script it is a lease hog: it forks
PROCESSES children, each opening CONNECTIONS connections and sending ATTACHES attach
requests on each, and prints how many leases were granted in all (leases outlive the
connections and processes that took them until they expire).  Run as ``raw_peer.py churn
PATH CYCLES`` it connects and closes CYCLES times; as ``raw_peer.py hold PATH COUNT
HANDSHAKE`` it opens COUNT connections (with the DEALER handshake if HANDSHAKE is 1), prints
how many it opened and how many the daemon still keeps, and holds them HOLD_S seconds (or until
it is ended).
"""
from __future__ import annotations

import os
import resource
import socket
import struct
import sys
import time

HOLD_S = 120
GREETING = b"\xff" + bytes(8) + b"\x7f\x03\x00" + b"NULL".ljust(20, b"\0") + bytes(32)


def frame(body: bytes, more: bool = False, command: bool = False) -> bytes:
    flags = (1 if more else 0) | (4 if command else 0)
    if len(body) < 256:
        return bytes([flags, len(body)]) + body
    return bytes([flags | 2]) + struct.pack(">Q", len(body)) + body


def ready(socket_type: bytes) -> bytes:
    return frame(b"\x05READY\x0bSocket-Type" + struct.pack(">I", len(socket_type)) + socket_type, command=True)


def connect(path: str, socket_type: bytes, timeout: float = 10.0) -> socket.socket:
    """A connection that has completed the NULL handshake as ``socket_type`` (b"DEALER", b"SUB", ...)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(path)
    sock.sendall(GREETING + ready(socket_type))
    greeting = recv_exactly(sock, 64)
    if greeting[:1] != b"\xff" or greeting[10] != 3:
        raise ConnectionError(f"not a ZMTP 3 greeting: {greeting!r}")
    flags, body = recv_frame(sock)
    if not flags & 4 or not body.startswith(b"\x05READY"):
        raise ConnectionError(f"expected READY, got {body[:40]!r}")
    return sock


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the daemon closed the connection")
        data += chunk
    return data


def recv_frame(sock: socket.socket) -> tuple[int, bytes]:
    flags = recv_exactly(sock, 1)[0]
    size = struct.unpack(">Q", recv_exactly(sock, 8))[0] if flags & 2 else recv_exactly(sock, 1)[0]
    return flags, recv_exactly(sock, size)


def packb(value) -> bytes:
    """msgpack for the few types a request holds (dict, str, int >= 0, None)."""
    if value is None:
        return b"\xc0"
    if isinstance(value, int):
        return bytes([value]) if value < 128 else b"\xce" + struct.pack(">I", value)
    if isinstance(value, str):
        data = value.encode()
        return (bytes([0xA0 | len(data)]) if len(data) < 32 else b"\xda" + struct.pack(">H", len(data))) + data
    if isinstance(value, dict):
        return bytes([0x80 | len(value)]) + b"".join(packb(k) + packb(v) for k, v in value.items())
    raise TypeError(type(value))


def request(op: str, request_id: int, args: dict) -> bytes:
    return packb({"v": "1.2", "id": request_id, "op": op, "args": args})


def attach_all(path: str, connections: int, attaches: int, host: str) -> int:
    granted = 0
    for index in range(connections):
        sock = connect(path, b"DEALER")
        for n in range(attaches):
            sock.sendall(frame(request("attach", n, {"pid": os.getpid(), "host": f"{index}-{n}-{host}",
                                                     "device": "cpu"})))
            granted += b"\xa2ok\xc3" in recv_frame(sock)[1]
        sock.close()
    return granted


def main(path: str, processes: int, connections: int, attaches: int, host_chars: int) -> None:
    host = "h" * host_chars
    if processes == 1:
        print(attach_all(path, connections, attaches, host), flush=True)
        return
    total = 0
    for _ in range(processes):  # one child after the other, each its own process to the kernel
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(read_end)
            os.write(write_end, str(attach_all(path, connections, attaches, host)).encode())
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end) as result:
            total += int(result.read() or 0)
        os.waitpid(child, 0)
    print(total, flush=True)


def churn(path: str, cycles: int) -> None:
    for _ in range(cycles):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        try:
            sock.connect(path)
        except OSError:
            pass
        sock.close()
    print(cycles, flush=True)


def plain(path: str) -> socket.socket:
    """A connection that sends nothing."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


def kept(sock: socket.socket) -> bool:
    """Whether the daemon still keeps this handshaken connection: it answers a PING."""
    try:
        sock.sendall(frame(b"\x04PING\x00\x00", command=True))
        flags, body = recv_frame(sock)
        return bool(flags & 4) and body.startswith(b"\x04PONG")
    except OSError:  # cut: closed, reset, or no answer within the socket's timeout
        return False


def hold(path: str, count: int, handshake: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # room for COUNT connections
    held = []
    for _ in range(count):
        try:
            held.append(connect(path, b"DEALER", timeout=5) if handshake else plain(path))
        except OSError:  # refused, reset, or the backlog full for 5 s
            pass
    print(len(held), sum(kept(sock) for sock in held) if handshake else 0, flush=True)
    time.sleep(HOLD_S)  # the test ends us sooner


if __name__ == "__main__":
    if sys.argv[1] == "churn":
        churn(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "hold":
        hold(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main(sys.argv[1], *(int(arg) for arg in sys.argv[2:6]))
