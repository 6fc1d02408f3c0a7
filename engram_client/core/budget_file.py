"""The node's gather budget as shared memory: its layout, seen from Python.

engram_client/lookup/host/engine/budget.h is the code that schedules on it and draws the whole layout; this
module holds what the daemon needs to create one and to read it for status, and the
client's side of handing it over:

    offset      0   header   magic "ENGBUDG1", version, file bytes, groups, slots, small_rows, flags, tokens[8],
                             decode[8] (tokens a prefill-size job never takes; zero from a daemon before them)
             4096   slots    64 x 128 B, one per rank process
    16384 + g*40960 group g  lock, counters, masks, owner hints, grant log
    lock bytes      1 GiB + s (slot s alive), 2 GiB + g*1024 + t (token t of group g)

It is a memfd sealed against shrinking and growing, so no process that maps it can be made to
fault by a peer truncating it; the daemon hands it to each rank over a unix socket beside its
request socket (SCM_RIGHTS), and the rank reopens it through /proc/self/fd for an open file
description of its own (the token locks are per open file description).  Torch-free.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import socket
import struct
import time

from .errors import ConfigError, DaemonUnavailableError

MAGIC = 0x3147445542474E45
VERSION = 1
MAX_SLOTS = 64
MAX_GROUPS = 8
MAX_TOKENS = 1024
SLOTS_AT, SLOT_BYTES = 4096, 128
GROUPS_AT, GROUP_BYTES = 16384, 40960
FILE_BYTES = GROUPS_AT + MAX_GROUPS * GROUP_BYTES
SMALL_ROWS = 16384  # a call of at most this many rows is decode-size: it goes first
FLAG_PREFILL_IDLE = 1  # the header's flags: ranks gather prefill-size calls at SCHED_IDLE (lookup/host/engine/crew.c)
PREFILL_GATHERS = {"normal": 0, "idle": FLAG_PREFILL_IDLE}  # engramd --prefill-gathers: the flags each sets
FLAG_NO_SPARES = 2  # ... and no spares of the prefill crews on the decode CPUs (engramd --decode-spares off)
FLAG_SPARES_QUIET = 4  # ... and the spares stand aside while a rank of the group decodes (--decode-spares quiet)
DECODE_SPARES = {"quiet": FLAG_SPARES_QUIET, "idle": 0, "off": FLAG_NO_SPARES}  # engramd --decode-spares: the flags each sets
_HEADER = struct.Struct(f"<QIIIIII{MAX_GROUPS}I{MAX_GROUPS}I")
_GROUP_COUNTERS = struct.Struct("<QQQQQQQQQiiqq")  # lock .. sweeps, gathering, peak, rotate_at, decode_at (NbGroup's first fields)
GROUP_DECODE_AT = _GROUP_COUNTERS.size - 8  # decode_at's offset in a group: when a rank last started a decode-size job
DECODE_QUIET_NS = 100_000_000  # a group whose decode_at is older than this is not decoding (quiet spares gather)
# NbSlot: seq, sleepers, want, want_small, held, group, pid, crew_held, last_grant, rows .. small_wait_blocks_max,
# crew_seen_at, stand_ins, standing_in
_SLOT = struct.Struct("<IIiiiiiiQQQQQQQQqQi")
TOKEN_LOCKS = 2 << 30
SLOT_LOCKS = 1 << 30
_FLOCK = struct.Struct("hhqqi4x")
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def decoding_lately(decode_at: int, now_ns: int) -> bool:
    """The C rule (nb_decode_window_end, engine/budget.c) for the daemon's status: a rank of the group
    started a decode-size job less than DECODE_QUIET_NS ago (a time ahead of ``now_ns`` is no rank's)."""
    return 0 < decode_at <= now_ns and now_ns - decode_at < DECODE_QUIET_NS


def create(tokens: list[int], slots: int = MAX_SLOTS, small_rows: int = SMALL_ROWS, flags: int = 0,
           decode: list[int] | None = None) -> int:
    """A new sealed budget (one group per entry of ``tokens``, header ``flags``, ``decode`` tokens of
    each group kept for decode-size jobs); returns its descriptor."""
    if not 1 <= len(tokens) <= MAX_GROUPS or not all(1 <= t <= MAX_TOKENS for t in tokens):
        raise ConfigError(f"a gather budget has 1..{MAX_GROUPS} groups of 1..{MAX_TOKENS} tokens, got {tokens}")
    decode = [0] * len(tokens) if decode is None else list(decode)
    if len(decode) != len(tokens) or not all(0 <= d < t for d, t in zip(decode, tokens)):
        raise ConfigError(f"each group keeps 0..tokens-1 decode tokens: {decode} for groups of {tokens} tokens")
    fd = os.memfd_create("engramd-gather-budget", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, FILE_BYTES)
        header = _HEADER.pack(MAGIC, VERSION, FILE_BYTES, len(tokens), slots, small_rows, flags,
                              *tokens, *[0] * (MAX_GROUPS - len(tokens)), *decode, *[0] * (MAX_GROUPS - len(decode)))
        os.pwrite(fd, header, 0)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def token_locked(fd: int, group: int, token: int) -> bool:
    """Whether the kernel holds token ``token`` of ``group`` for some open file description other than fd's."""
    probe = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, TOKEN_LOCKS + group * MAX_TOKENS + token, 1, 0)
    return _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe))[0] != fcntl.F_UNLCK


def lock_token(fd: int, group: int, token: int) -> bool:
    """Take a token's lock on fd's open file description outside the protocol (what a hostile peer
    can do; tests use it).  False if someone holds it."""
    lock = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, TOKEN_LOCKS + group * MAX_TOKENS + token, 1, 0)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, lock)
        return True
    except OSError:
        return False


class BudgetView:
    """A read-only view of a budget's counters (the daemon's status, tests)."""

    def __init__(self, fd: int):
        self._map = mmap.mmap(fd, FILE_BYTES, mmap.MAP_SHARED, mmap.PROT_READ)
        self.fd = fd
        fields = _HEADER.unpack_from(self._map, 0)
        if fields[0] != MAGIC or fields[1] != VERSION:
            raise ConfigError("not a gather budget of this version")
        self.groups, self.slots, self.flags = fields[3], fields[4], fields[6]
        self.tokens = list(fields[7:7 + self.groups])
        self.decode = list(fields[7 + MAX_GROUPS:7 + MAX_GROUPS + self.groups])

    def group(self, g: int) -> dict:
        values = _GROUP_COUNTERS.unpack_from(self._map, GROUPS_AT + g * GROUP_BYTES)
        return {"grants": values[6], "sweeps": values[8], "gathering": values[9], "peak": values[10],
                "want_mask": values[3], "small_mask": values[4], "holding_mask": values[5], "decode_at": values[12],
                "decoding": decoding_lately(values[12], time.monotonic_ns()),
                "locked": sum(token_locked(self.fd, g, t) for t in range(self.tokens[g]))}

    def slot(self, s: int) -> dict:
        values = _SLOT.unpack_from(self._map, SLOTS_AT + s * SLOT_BYTES)
        return {"want": values[2], "held": values[4], "group": values[5], "pid": values[6], "rows": values[9],
                "small_waits": values[14], "small_wait_blocks_max": values[15], "crew_held": values[7],
                "stand_ins": values[17], "standing_in": values[18]}

    def close(self) -> None:
        self._map.close()


def receive(socket_path: str, timeout: float) -> int:
    """The budget's descriptor from the daemon's budget socket, reopened as this process's own."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(socket_path)
            _, fds, _, _ = socket.recv_fds(sock, 16, 1)
    except OSError as exc:
        raise DaemonUnavailableError(f"could not get the gather budget from {socket_path} within {timeout:.1f} s: "
                                     f"{exc}") from exc
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise DaemonUnavailableError(f"{socket_path} sent {len(fds)} descriptors instead of the gather budget"
                                     + ("" if fds else " (none: the daemon sends none to a user that leaves too "
                                                       "many unread, nor while it stops)"))
    try:
        if (fcntl.fcntl(fds[0], fcntl.F_GET_SEALS) & SEALS) != SEALS:
            raise DaemonUnavailableError(f"{socket_path} sent memory that is not sealed against resizing")
        # A descriptor of our own: the daemon's open file description is shared by every rank.
        return os.open(f"/proc/self/fd/{fds[0]}", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:  # its mode changed under the daemon (fchmod by a process of the daemon's user)
        info = os.fstat(fds[0])
        raise DaemonUnavailableError(f"cannot take the gather budget {socket_path} sent as this process's own: "
                                     f"{exc.strerror} (its memory has mode {info.st_mode & 0o7777:o}, owner uid "
                                     f"{info.st_uid}; this process has uid {os.geteuid()})") from exc
    finally:
        os.close(fds[0])
