"""Names another user makes in a shared shm dir (mode 1777) never decide whether the daemon runs.

Before the daemon starts, a second real user (other_user) plants every name the daemon once
wrote in the shm dir itself: each generation's ``*.table.partial`` and ``*.table``, the served
record and a temporary of it, the instance's lock file (whose name anyone can work out: before,
it alone stopped the daemon from starting), and the name of the daemon's own directory.  The daemon runs as
root, and as a third, unprivileged user (daemon_user), who can neither rename over nor remove
what the planter owns.  Each must load, reload, and after kill -9 restart onto the reloaded
checkpoint, leaving every planted file as it was.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap

import pytest

from engramd.shm.table_files import instance_id
from engramd.synth.writer import write_checkpoint
from engram_client.tools.serve_process import serve_command
from hugetlbfs_mount import mounted_hugetlbfs
from other_user import SYSTEM_PYTHON, daemon_user, other_user  # noqa: F401  (fixtures)
from waiting import wait_for

PLANT = textwrap.dedent("""
    import os, sys
    shm, instance, directory_too, content = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
    names = [f"engramd-{instance}-g{n}.table{suffix}" for n in range(1, 5) for suffix in ("", ".partial")]
    names += [f"engramd-{instance}.served", f"engramd-{instance}.served.tmp-1", f"engramd-{instance}.lock"]
    for name in names:
        with open(os.path.join(shm, name), "w") as f:
            f.write(content)
        os.chmod(os.path.join(shm, name), 0o666)
        print(os.path.join(shm, name))
    if directory_too:
        os.mkdir(os.path.join(shm, f"engramd-{instance}"), 0o777)
        os.chmod(os.path.join(shm, f"engramd-{instance}"), 0o777)
        print(os.path.join(shm, f"engramd-{instance}"))
""")
ASK = textwrap.dedent("""
    import json, sys
    from engram_client.attach.connection import DaemonConnection
    from engram_client.core.errors import EngramError
    try:
        reply = DaemonConnection(sys.argv[1]).request(sys.argv[2], json.loads(sys.argv[3]), timeout=10)
    except EngramError as exc:
        reply = {"error": str(exc)}
    print(json.dumps(reply))
""")


@pytest.fixture
def shared_shm(shm_dir):
    os.chmod(shm_dir, 0o1777)
    return shm_dir


def plant(user, shm: str, instance: str, directory_too: bool,
          content: str = '{"configured": null, "served": "/planted"}') -> dict[str, bytes]:
    """The planted paths and what each holds (b"" for the directory)."""
    paths = user.run(SYSTEM_PYTHON, "-c", PLANT, shm, instance, "1" if directory_too else "0", content).stdout.split()
    return {path: b"" if os.path.isdir(path) else open(path, "rb").read() for path in paths}


def assert_untouched(planted: dict[str, bytes], user) -> None:
    for path, content in planted.items():
        info = os.lstat(path)
        assert info.st_uid == user.uid, f"{path} changed hands"
        assert content == (b"" if stat.S_ISDIR(info.st_mode) else open(path, "rb").read()), f"{path} was rewritten"


def two_checkpoints(models: str) -> tuple[str, str]:
    a, b = os.path.join(models, "a"), os.path.join(models, "b")
    write_checkpoint(a, vocab_size=300, head_dim=128, seed=1)
    write_checkpoint(b, vocab_size=300, head_dim=128, seed=2)
    return a, b


def assert_own_directory(path: str, shm: str, uid: int, mode: int = 0o700) -> None:
    info = os.lstat(path)
    assert os.path.dirname(path) == shm and stat.S_ISDIR(info.st_mode), path
    assert info.st_uid == uid and stat.S_IMODE(info.st_mode) == mode, (path, info.st_uid, oct(info.st_mode))


def test_a_root_daemon_loads_reloads_and_restarts_past_planted_names(daemon_factory, socket_dir, shared_shm,
                                                                     other_user, tmp_path):
    a, b = two_checkpoints(str(tmp_path / "models"))
    instance = instance_id(f"ipc://{socket_dir}/engramd.sock")
    planted = plant(other_user, shared_shm, instance, directory_too=True)
    daemon = daemon_factory("--checkpoint", a)
    first = daemon.wait_state("ready", "failed")
    assert first["state"] == "ready", first["error"]
    home = os.path.dirname(first["table_path"])
    assert_own_directory(home, shared_shm, 0)
    assert home.startswith(os.path.join(shared_shm, f"engramd-{instance}.")), home  # its plain name is taken
    assert f"is a directory of uid {other_user.uid}" in daemon.log() and home in daemon.log()
    daemon.connection.request("reload", {"checkpoint": b})
    wait_for(lambda: (s := daemon.status())["generation"] == 2 and s["state"] == "ready", "the reload to b", 60)
    daemon.kill(signal.SIGKILL)

    again = daemon_factory("--checkpoint", a)  # the unit's command line still says a
    status = again.wait_state("ready", "failed")
    assert status["state"] == "ready" and status["checkpoint"] == b and status["adopted"], status
    assert os.path.dirname(status["table_path"]) == home
    assert other_user.run("touch", os.path.join(home, "x"), check=False).returncode != 0
    again.connection.request("stop")
    assert again.proc.wait(timeout=60) == 0
    assert_untouched(planted, other_user)


def ask(user, endpoint: str, op: str, args: dict | None = None) -> dict:
    """A request from a process of ``user`` (a client of the daemon's own user)."""
    asked = subprocess.run(user.command(sys.executable, "-c", ASK, endpoint, op, json.dumps(args or {})),
                           capture_output=True, text=True, timeout=60, cwd="/")
    assert asked.returncode == 0, asked.stderr
    return json.loads(asked.stdout)


def settled(user, endpoint: str) -> dict:
    return wait_for(lambda: (s := ask(user, endpoint, "status")).get("state") in ("ready", "failed") and s,
                    "the daemon to be ready or failed", 90)


def test_an_unprivileged_daemon_loads_reloads_and_restarts_past_planted_names(shared_shm, daemon_user, other_user):
    base = tempfile.mkdtemp(prefix="engt-u-")  # somewhere the daemon's user may read (tmp_path is root's)
    os.chmod(base, 0o755)
    processes = []
    try:
        a, b = two_checkpoints(os.path.join(base, "models"))
        sockets = os.path.join(base, "sockets")
        os.mkdir(sockets, 0o700)
        os.chown(sockets, daemon_user.uid, daemon_user.gid)
        endpoint = f"ipc://{sockets}/engramd.sock"
        planted = plant(other_user, shared_shm, instance_id(endpoint), directory_too=False)
        log = open(os.path.join(base, "engramd.log"), "ab")

        def start() -> subprocess.Popen:
            processes.append(daemon_user.spawn(*serve_command(endpoint, shared_shm, "--checkpoint", a,
                                                              log_level="info"), stdout=log, stderr=subprocess.STDOUT,
                                               cwd="/"))
            return processes[-1]

        first_process = start()
        first = settled(daemon_user, endpoint)
        assert first["state"] == "ready", first["error"]
        with open(f"/proc/{first_process.pid}/status") as f:  # an unprivileged daemon indeed
            facts = dict(line.split(":", 1) for line in f)
        assert facts["Uid"].split()[1] == str(daemon_user.uid) and int(facts["CapEff"], 16) == 0
        home = os.path.dirname(first["table_path"])
        assert_own_directory(home, shared_shm, daemon_user.uid)
        assert os.stat(first["table_path"]).st_uid == daemon_user.uid
        ask(daemon_user, endpoint, "reload", {"checkpoint": b})
        wait_for(lambda: (s := ask(daemon_user, endpoint, "status")).get("generation") == 2 and
                 s["state"] == "ready", "the reload to b", 90)
        first_process.kill()
        first_process.wait(timeout=30)

        start()
        status = settled(daemon_user, endpoint)
        assert status["state"] == "ready" and status["checkpoint"] == b and status["adopted"], status
        assert os.path.dirname(status["table_path"]) == home
        assert_untouched(planted, other_user)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)


def test_the_daemons_group_opens_its_table_but_cannot_list_or_add_names(daemon_factory, shared_shm, other_user):
    daemon = daemon_factory("--group", other_user.name)  # useradd --user-group: the user's own group
    status = daemon.wait_state("ready")
    home = os.path.dirname(status["table_path"])
    assert_own_directory(home, shared_shm, 0, mode=0o710)
    assert os.stat(home).st_gid == other_user.gid
    opened = other_user.run(SYSTEM_PYTHON, "-c", "import sys; print(open(sys.argv[1], 'rb').read(8))",
                            status["table_path"])
    assert opened.stdout.strip() == "b'ENGRAMTB'"
    assert other_user.run("ls", home, check=False).returncode != 0
    assert other_user.run("touch", os.path.join(home, "x"), check=False).returncode != 0


def test_a_shared_hugetlbfs_mount_gets_the_same_directory(daemon_factory, socket_dir, other_user, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    write_checkpoint(ckpt, vocab_size=1500, head_dim=256, seed=4)
    base = tempfile.mkdtemp(prefix="engt-huge-")  # a path the planter can reach (tmp_path is root's)
    os.chmod(base, 0o755)
    try:
        with mounted_hugetlbfs(pathlib.Path(base) / "huge", 128, "mode=1777") as mount:
            # hugetlbfs has no write(2): the planted files stay empty
            planted = plant(other_user, mount, instance_id(f"ipc://{socket_dir}/engramd.sock"), False, content="")
            daemon = daemon_factory("--checkpoint", ckpt, shm=mount)
            status = daemon.wait_state("ready", "failed")
            assert status["state"] == "ready", status["error"]
            assert_own_directory(os.path.dirname(status["table_path"]), mount, 0)
            daemon.kill(signal.SIGKILL)
            again = daemon_factory("--checkpoint", ckpt, shm=mount)
            readopted = again.wait_state("ready", "failed")
            assert readopted["adopted"] and readopted["table_path"] == status["table_path"]
            again.connection.request("stop")
            assert again.proc.wait(timeout=60) == 0
            assert_untouched(planted, other_user)
    finally:
        shutil.rmtree(base, ignore_errors=True)
