"""Three real users in one group G, as deployed ranks are: the daemon's, an impostor's, a rank's.

The daemon runs as its own user with ``--group G``, its socket in a root-owned sticky directory
(as /tmp is). It stops; another member of G runs a real ``engramd serve --group G`` at the
same path (its socket: that user's, group G, 0660). A third member's rank, attached with
``auto_refresh=True``, must go on reading the real rows, and neither it nor a new client may
talk to the impostor: a group in common is no trust, only the daemon's user the operator
names (ENGRAMD_DAEMON_USER) is. Before, the rank re-attached to the impostor and served its
rows, and a new client attached to it directly.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

from engramd_as import engramd_argv
from other_user import created_user, daemon_user, other_user  # noqa: F401  (fixtures)
from waiting import end_process, wait_for

TESTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
IMPOSTOR_SEED = 7  # other rows than the real daemon's (seed 0) under the same layout

# A rank of the third user: everything imported as root first (the interpreter lives where other
# users cannot read), then it becomes that user, in group G, and answers one JSON line per command.
RANK = textwrap.dedent("""
    import importlib, json, logging, os, pkgutil, sys
    import torch, engram_client
    for info in pkgutil.walk_packages(engram_client.__path__, "engram_client."):
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional part (triton, an engine) that a CPU rank does not use
            pass
    endpoint, uid, gid, group, tests_dir, impostor_shm = sys.argv[1:7]
    sys.path.insert(0, tests_dir)
    from exactness import assert_bf16_exact
    from engram_client import EngramClient, EngramError
    from engram_client.core.demo_rows import demo_rows
    os.setgroups([int(group)]); os.setgid(int(gid)); os.setuid(int(uid))
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)
    client, ids = None, torch.arange(0, 400, dtype=torch.int64)

    def exact():
        for layer in client.layers:
            assert_bf16_exact(client.table(layer).lookup(ids), *demo_rows(0, layer, ids.numpy(), 256))
        return True

    def answer(command):
        global client
        try:
            if command == "attach":
                client = EngramClient(endpoint=endpoint, device="cpu", timeout=30, auto_refresh=True)
                return {"table_path": client.table_path}
            if command == "lookup":
                return {"exact": exact(), "table_path": client.table_path, "refresh_pending": client.refresh_pending}
            if command == "refresh":
                return {"refreshed": client.refresh()}
            if command == "new":
                with EngramClient(endpoint=endpoint, device="cpu", timeout=5) as other:
                    return {"table_path": other.table_path}
            if command == "maps":
                with open("/proc/self/maps") as maps:
                    return {"maps_impostor": impostor_shm in maps.read()}
        except (EngramError, AssertionError) as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}

    for line in sys.stdin:
        print(json.dumps(answer(line.strip())), flush=True)
""")


@pytest.fixture
def rank_user():
    """The third user: a rank of group G, neither the daemon's user nor the impostor."""
    with created_user() as user:
        yield user


class Rank:
    def __init__(self, user, group: int, endpoint: str, impostor_shm: str, log_path: str, env: dict):
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", RANK, endpoint, str(user.uid), str(user.gid), str(group), TESTS_DIR,
                 impostor_shm], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, cwd="/",
                env=env)

    def ask(self, command: str, timeout: float = 60.0) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        assert line, f"the rank did not answer {command!r} within {timeout} s:\n{self.log()}"
        return json.loads(line)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def close(self) -> None:
        self.proc.stdin.close()
        end_process(self.proc, grace=10)


def serve_as(user, group: int, endpoint: str, shm: str, log_path: str, *extra: str) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(engramd_argv(user, "serve", "--socket", endpoint, "--shm-dir", shm, "--group",
                                             str(group), "--no-progress", "--log-level", "info", *extra,
                                             groups=(group,)), stdout=log, stderr=subprocess.STDOUT, cwd="/")


def read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def serving(proc: subprocess.Popen, log_path: str, socket_path: str, uid: int) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"engramd of uid {uid} exited with {proc.returncode}:\n{read(log_path)}")
    return "state -> ready" in read(log_path) and os.path.exists(socket_path) and os.stat(socket_path).st_uid == uid


def test_a_group_members_rank_never_follows_its_socket_to_another_members_daemon(daemon_user, other_user,
                                                                                 rank_user):
    group = daemon_user.gid  # G: the daemon user's group; the impostor and the rank are members
    base = tempfile.mkdtemp(prefix="engt-grp-")
    os.chmod(base, 0o1777)  # root's, shared and sticky, like /tmp
    shms = {}
    for name, user in (("real", daemon_user), ("impostor", other_user)):
        shms[name] = tempfile.mkdtemp(prefix=f"engt-{name}-", dir="/dev/shm")
        os.chown(shms[name], user.uid, user.gid)
        os.chmod(shms[name], 0o755)
    logs = tempfile.mkdtemp(prefix="engt-logs-")
    endpoint = f"ipc://{base}/engramd.sock"
    socket_path = endpoint[len("ipc://"):]
    env = {key: value for key, value in os.environ.items() if key != "ENGRAMD_DAEMON_USER"}
    processes, ranks = [], []
    try:
        real = serve_as(daemon_user, group, endpoint, shms["real"], f"{logs}/real.log", "--lease-seconds", "1.5")
        processes.append(real)
        wait_for(lambda: serving(real, f"{logs}/real.log", socket_path, daemon_user.uid), "the real daemon", 60)

        # Without the daemon's user named, a group member's rank trusts no other user's socket.
        unnamed = Rank(rank_user, group, endpoint, shms["impostor"], f"{logs}/unnamed.log", env)
        ranks.append(unnamed)
        refused = unnamed.ask("attach")
        assert f"uid {daemon_user.uid}" in refused.get("error", "") and "ENGRAMD_DAEMON_USER" in refused["error"], \
            refused

        rank = Rank(rank_user, group, endpoint, shms["impostor"], f"{logs}/rank.log",
                    dict(env, ENGRAMD_DAEMON_USER=daemon_user.name))
        ranks.append(rank)
        table_path = rank.ask("attach")["table_path"]
        assert rank.ask("lookup")["exact"] is True

        real.terminate()
        assert real.wait(timeout=60) == 0, read(f"{logs}/real.log")
        impostor = serve_as(other_user, group, endpoint, shms["impostor"], f"{logs}/impostor.log",
                            "--demo-seed", str(IMPOSTOR_SEED))
        processes.append(impostor)
        wait_for(lambda: serving(impostor, f"{logs}/impostor.log", socket_path, other_user.uid),
                 "the impostor to serve on the same path", 60)
        refusal = f"socket of uid {other_user.uid}"
        wait_for(lambda: refusal in rank.log() or "attached" in read(f"{logs}/impostor.log"),
                 "the rank's heartbeat to meet the impostor's socket", 30)

        for _ in range(3):  # lookups go on from the real table, with auto_refresh on
            assert rank.ask("lookup") == {"exact": True, "table_path": table_path, "refresh_pending": False}
        assert refusal in rank.ask("refresh").get("error", "")
        assert refusal in rank.ask("new").get("error", ""), "a new client attached to the impostor"
        assert rank.ask("maps") == {"maps_impostor": False}, "the rank mapped the impostor's table"
        assert "attached" not in read(f"{logs}/impostor.log"), "the impostor granted a lease"
    finally:
        for each in ranks:
            each.close()
        for proc in processes:
            end_process(proc)
        for path in (base, logs, *shms.values()):
            shutil.rmtree(path, ignore_errors=True)
