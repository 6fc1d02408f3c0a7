"""``engramd`` run by another local user: the real command line, under that user's uid and gids.

The test interpreter and the repository may live where another user cannot read
(/root), so the child imports everything engramd may need first, then drops to the
user (setgroups, setgid, setuid) and runs the command line.  The process that serves,
binds and creates files is a real engramd whose every system call runs as that user.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import IO

from other_user import OtherUser

_AS_USER = textwrap.dedent("""
    import importlib, os, pkgutil, sys
    import engramd, engram_client.core
    for package in (engramd, engram_client.core):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            # __main__ would run the command line; synth.writer is the synth command's, the one that
            # needs torch (seconds of import a process), and no command run here is synth.
            if not info.name.endswith("__main__") and info.name != "engramd.synth.writer":
                importlib.import_module(info.name)
    import engram_client.attach.connection, engram_client.attach.readiness  # noqa: F401
    uid, gid = int(sys.argv[1]), int(sys.argv[2])
    groups = [int(g) for g in sys.argv[3].split(",") if g]
    os.setgroups(groups); os.setgid(gid); os.setuid(uid)
    from engramd.cli.main import main
    main(sys.argv[4:], prog_name="engramd")
""")


def engramd_argv(user: OtherUser, *args: str, groups: tuple[int, ...] = ()) -> list[str]:
    """The argv of ``engramd ARGS`` run as ``user`` (with ``groups`` as its supplementary groups)."""
    return [sys.executable, "-c", _AS_USER, str(user.uid), str(user.gid), ",".join(map(str, groups)), *args]


def spawn_engramd(user: OtherUser, *args: str, output: IO | None = None) -> subprocess.Popen:
    """A long-running ``engramd`` (``serve``) as ``user``; the caller stops it."""
    return subprocess.Popen(engramd_argv(user, *args), stdout=output, stderr=subprocess.STDOUT, cwd="/")


def run_engramd(user: OtherUser, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run(engramd_argv(user, *args), capture_output=True, text=True, timeout=timeout, cwd="/")
