"""The daemon as a process: load, status, stop, signals, failed loads, restarts."""
from __future__ import annotations

import os
import signal

import pytest

from engram_client.core.errors import DaemonUnavailableError
from engram_client.core.table_file import read_header
from engramd.synth.writer import write_checkpoint
from tmpfs_mount import mounted_tmpfs


def test_demo_table_serves_and_status_has_contract_fields(demo_daemon):
    status = demo_daemon.status()
    for field in ("state", "generation", "boot_id", "checkpoint", "table_bytes", "files", "layers", "load",
                  "clients", "error"):
        assert field in status, field
    assert status["state"] == "ready" and status["error"] is None
    assert [layer["layer"] for layer in status["layers"]] == [1, 14]
    assert status["load"]["done_bytes"] == status["load"]["total_bytes"] > 0
    header, _ = read_header(status["table_path"])
    assert header.total_bytes == status["table_bytes"] == os.path.getsize(status["table_path"])
    assert os.stat(status["table_path"]).st_mode & 0o777 == 0o600


def test_status_during_a_load_shows_progress(daemon_factory, tmp_path):
    write_checkpoint(str(tmp_path / "ckpt"), vocab_size=3000, head_dim=256)
    # 2 MB/s makes a ~38 MB load last long enough to watch it.
    daemon = daemon_factory("--checkpoint", str(tmp_path / "ckpt"), "--max-load-rate", "2", "--load-threads", "2")
    status = daemon.wait_state("loading", timeout=30)
    seen = []
    while status["state"] == "loading" and len(seen) < 3:
        if 0 < status["load"]["done_bytes"] < status["load"]["total_bytes"]:
            seen.append(status["load"]["done_bytes"])
        status = daemon.wait_state("loading", "ready", timeout=30)
    assert seen, "never saw partial progress"
    assert status["table_path"] is None, "a table path was published before the load finished"
    assert not [name for name in daemon.table_files() if not name.endswith(".partial")]
    assert status["layers"] and status["table_bytes"] > 0
    daemon.connection.request("stop")
    assert daemon.proc.wait(timeout=30) == 0
    assert daemon.table_files() == [], "stopping during a load left a file behind"


@pytest.mark.parametrize("how", ["sigterm", "sigint", "stop"])
def test_stop_unlinks_table_and_socket_and_exits_zero(demo_daemon, how):
    path = demo_daemon.status()["table_path"]
    socket_path = demo_daemon.endpoint[len("ipc://"):]
    assert os.path.exists(socket_path)
    if how == "stop":
        demo_daemon.connection.request("stop")
        code = demo_daemon.proc.wait(timeout=30)
    else:
        code = demo_daemon.kill(signal.SIGTERM if how == "sigterm" else signal.SIGINT)
    assert code == 0
    assert not os.path.exists(path)
    assert not os.path.exists(socket_path)
    assert demo_daemon.table_files() == []


def test_failed_load_keeps_daemon_answering(daemon_factory, tmp_path):
    ckpt = tmp_path / "ckpt"
    write_checkpoint(str(ckpt), vocab_size=100, head_dim=64)
    shard = ckpt / "model.safetensors"
    os.truncate(shard, os.path.getsize(shard) - 100)
    daemon = daemon_factory("--checkpoint", str(ckpt))
    status = daemon.wait_state("failed")
    assert "model.safetensors" in status["error"] and "truncated" in status["error"]
    assert daemon.table_files() == []
    assert daemon.status()["state"] == "failed"  # still answering
    daemon.connection.request("stop")
    assert daemon.proc.wait(timeout=30) == 0


def test_two_daemons_on_different_sockets_and_shm_dirs(daemon_factory, shm_dir):
    other_shm = os.path.join(shm_dir, "shm2")  # on tmpfs too: a disk dir would be refused
    os.mkdir(other_shm)
    a = daemon_factory("--demo-seed", "1", name="a")
    b = daemon_factory("--demo-seed", "2", name="b", shm=str(other_shm))
    sa, sb = a.wait_state("ready"), b.wait_state("ready")
    assert sa["boot_id"] != sb["boot_id"]
    assert os.path.dirname(sa["table_path"]) != os.path.dirname(sb["table_path"])
    assert sa["fingerprint"] != sb["fingerprint"]
    a.connection.request("stop")
    assert a.proc.wait(timeout=30) == 0
    assert b.status()["state"] == "ready" and os.path.exists(sb["table_path"])


def test_same_endpoint_twice_is_refused(demo_daemon, daemon_factory):
    second = daemon_factory(shm=demo_daemon.shm_dir)
    assert second.proc.wait(timeout=30) == 1
    # The refusal names the daemon in the way, so the operator knows which process to look at.
    assert f"another engramd (pid {demo_daemon.proc.pid}) is serving" in second.log()
    assert demo_daemon.status()["state"] == "ready"


def test_kill_9_then_restart_readopts_the_complete_table(daemon_factory):
    first = daemon_factory("--demo-seed", "5")
    status = first.wait_state("ready")
    first.kill(signal.SIGKILL)
    assert os.path.exists(status["table_path"]), "kill -9 cannot unlink"
    with pytest.raises(DaemonUnavailableError):
        first.connection.request("status", timeout=0.5)
    second = daemon_factory("--demo-seed", "5")
    restarted = second.wait_state("ready")
    assert restarted["adopted"] is True
    assert restarted["boot_id"] != status["boot_id"]
    assert restarted["table_path"] == status["table_path"] and restarted["generation"] == status["generation"]
    assert restarted["fingerprint"] == status["fingerprint"]
    assert second.table_files() == [os.path.basename(restarted["table_path"])]


def test_kill_9_then_restart_with_another_table_loads_afresh(daemon_factory):
    first = daemon_factory("--demo-seed", "5")
    old = first.wait_state("ready")
    first.kill(signal.SIGKILL)
    second = daemon_factory("--demo-seed", "6")  # a different table: the old one must not be served
    new = second.wait_state("ready")
    assert new["adopted"] is False and new["fingerprint"] != old["fingerprint"]
    assert "not the one to serve" in second.log()
    assert second.table_files() == [os.path.basename(new["table_path"])]


def test_orphan_of_another_live_daemon_is_left_alone(daemon_factory):
    a = daemon_factory(name="a")
    path_a = a.wait_state("ready")["table_path"]
    b = daemon_factory(name="b")  # same shm dir, different endpoint
    b.wait_state("ready")
    assert os.path.exists(path_a)
    assert len(b.table_files()) == 2


def test_shm_too_small_fails_with_advice(daemon_factory, tmp_path):
    with mounted_tmpfs(tmp_path / "small", "size=4M") as small:
        daemon = daemon_factory(shm=small)
        status = daemon.wait_state("failed")
        assert "--shm-size" in status["error"] and "needs" in status["error"]
        # deploy/kubernetes/README.md rules an emptyDir out (no other pod can mount it): never advise one
        assert "emptyDir" not in status["error"] and "hostPath" in status["error"], status["error"]
        assert daemon.table_files() == []
        daemon.stop()
