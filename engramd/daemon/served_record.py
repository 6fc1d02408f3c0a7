"""What this daemon serves, recorded durably so a restart serves it again.

After ``reload --checkpoint B`` a daemon started with ``--checkpoint A`` serves B.  If it
then crashes and its unit restarts it with the same ``--checkpoint A``, serving A again
would silently roll every client back.  So before a generation is served (before any
client can see it: status, attach, the event), the daemon writes
``<files dir>/engramd-<instance>.served`` (the files directory: private_dir.py):

    {"configured": <the --checkpoint it was started with>, "served": <what it serves>}

The record exists only while it says something ``--checkpoint`` does not: serving the
configured checkpoint again removes it, so a daemon that was never reloaded elsewhere
leaves nothing behind.  The rule at start: if the record's ``configured`` is the ``--checkpoint`` given now, the
record's ``served`` checkpoint is loaded (or re-adopted) instead, provided it still lies
under a reload root; if the operator gave another ``--checkpoint``, that wins.

The record is owner-only (0600), written to a fresh temporary name with O_EXCL and
O_NOFOLLOW (``<record>.tmp-<pid>``), fsynced and renamed into place, and read only if it
is a regular file of the daemon's user that nobody else may write (see safe_paths).  A
record that cannot be written fails the generation it was for, which is then not served:
a crash can never leave clients on a generation a restart would not serve.  A crash while
the record is being written leaves its temporary; the next start of the same instance
removes such temporaries (its lock shows nobody else is writing them), only if they are
regular files of the daemon's user.
"""
from __future__ import annotations

import json
import logging
import os
import re
from typing import Callable

from engram_client.core.errors import EngramError

from ..guards.safe_paths import UnsafePathError, foreign_reason, open_owned
from ..guards.whole_files import write_then_rename

log = logging.getLogger("engramd.served_record")
MAX_RECORD_BYTES = 16 * 1024


def record_path(directory: str, instance: str) -> str:
    return os.path.join(directory, f"engramd-{instance}.served")


def prepare_record(files_dir: str, shm_dir: str, instance: str) -> str:
    """The record's path for this instance, once stale temporaries are gone and a record kept in
    the shm dir itself (before files directories existed) is moved into ``files_dir``."""
    path = record_path(files_dir, instance)
    stale = re.compile(re.escape(os.path.basename(path)) + r"\.tmp-\d+$")
    for directory in dict.fromkeys((files_dir, shm_dir)):
        for name in sorted(os.listdir(directory)):
            leftover = os.path.join(directory, name)
            if stale.match(name) and foreign_reason(leftover) is None:
                try:
                    os.unlink(leftover)
                    log.info("removed %s, a served record a crashed daemon was writing", leftover)
                except FileNotFoundError:
                    pass
    old = record_path(shm_dir, instance)
    if old != path and os.path.lexists(old) and foreign_reason(old) is None and not os.path.lexists(path):
        os.rename(old, path)
        log.info("moved the served record %s to %s", old, path)
    return path


def read_record(path: str) -> dict | None:
    """The record, or None if there is none or it cannot be trusted (said in the log)."""
    if not os.path.lexists(path):
        return None
    try:
        fd = open_owned(path, os.O_RDONLY, "served record")
    except UnsafePathError as exc:
        log.warning("ignoring %s", exc)
        return None
    try:
        blob = os.read(fd, MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    try:
        record = json.loads(blob) if len(blob) <= MAX_RECORD_BYTES else None
    except ValueError:
        record = None
    if not isinstance(record, dict) or not all(isinstance(record.get(k), (str, type(None)))
                                               for k in ("configured", "served")):
        log.warning("ignoring %s: not a record this daemon wrote", path)
        return None
    return record


def write_record(path: str, configured: str | None, served: str | None) -> None:
    """Replace the record atomically, or remove it once what is served is --checkpoint again
    (it then says nothing a restart would not do anyway); nothing is written if the record
    already says so.  Raises OSError: the caller decides what a record it cannot write means."""
    if served == configured:
        if os.path.lexists(path) and foreign_reason(path) is None:
            os.unlink(path)
        return
    if read_record(path) == {"configured": configured, "served": served}:
        return
    temporary = f"{path}.tmp-{os.getpid()}"
    blob = json.dumps({"configured": configured, "served": served}).encode()
    try:
        os.unlink(temporary)  # our own leftover: the name carries our pid
    except FileNotFoundError:
        pass
    write_then_rename(temporary, path, blob, OSError, durable=True)


def resume_target(path: str, configured: str | None) -> str | None:
    """The checkpoint a predecessor served after starting from ``configured``, if any."""
    record = read_record(path)
    if record is None or record.get("configured") != configured or record.get("served") == configured:
        return None
    return record.get("served")


def resume_checkpoint(path: str, configured: str | None,
                      allowed: Callable[[str], str]) -> tuple[str | None, str | None]:
    """The checkpoint to serve at start, and why it is not simply ``configured`` (--checkpoint;
    None: nothing to say): the predecessor started from it was reloaded onto another, which is
    served if ``allowed`` (the reload-root check) accepts it.  The daemon logs the why;
    ``--print-config`` prints it."""
    target = resume_target(path, configured)
    if target is None:
        return configured, None
    try:
        target = allowed(target)
    except EngramError as exc:
        return configured, f"the reload target {target} recorded in {path} is not resumed: {exc}"
    started = f"--checkpoint {configured}" if configured else "the demo table (no --checkpoint)"
    back = f"; `engramd reload --checkpoint {configured}` goes back to it" if configured else ""
    return target, f"a daemon started from {started} was reloaded onto it ({path}){back}"
