"""A ZMTP 3.0 peer made of a plain AF_UNIX socket and the standard library.

It does what libzmq's own sockets never do (frames flagged MORE forever, subscriptions of
any size, requests it never reads the answers to) and, needing neither pyzmq nor msgpack,
runs as another user on the system's Python.  Run as a script it is a lease hog: it forks
PROCESSES children, each opening CONNECTIONS connections and sending ATTACHES attach
requests on each, and prints how many leases were granted in all (leases outlive the
connections and processes that took them until they expire).
"""
from __future__ import annotations

import os
import socket
import struct
import sys

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


if __name__ == "__main__":
    main(sys.argv[1], *(int(arg) for arg in sys.argv[2:6]))
