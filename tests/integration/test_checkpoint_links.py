"""Links and special files planted among a checkpoint's files under a reload root.

Each test reloads a real daemon onto a checkpoint (real safetensors files from synth) in
which one file was replaced by what someone with write access under the reload root could
put there, and checks that the reload fails at once, saying what the file is, while the
served generation goes on; and that nothing read from a file outside the root reaches the
status every peer can read.
"""
from __future__ import annotations

import os
import re
import struct

import pytest

from engramd.synth.writer import write_checkpoint
from waiting import wait_for

SECRET = b"root:$6$saltsalt$" + b"x" * 4000  # stands for /etc/shadow: a file outside the root


@pytest.fixture
def served_and_target(tmp_path):
    root = tmp_path / "models"
    served, target = str(root / "a"), str(root / "b")
    write_checkpoint(served, vocab_size=300, head_dim=128, seed=1)
    write_checkpoint(target, vocab_size=300, head_dim=128, seed=2, tokenizer_vocab=64)
    return str(root), served, target


def failed_reload(daemon, target: str) -> dict:
    """Reload onto ``target``; the reload's failure as status reports it, the served generation intact."""
    started = daemon.connection.request("reload", {"checkpoint": target})
    reload = wait_for(lambda: (r := daemon.status()["reload"]) and r["state"] == "failed" and r,
                      f"the reload of generation {started['generation']} to fail", timeout=60)
    status = daemon.status()
    assert status["state"] == "ready" and status["generation"] == 1
    return reload


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_a_shard_linked_to_a_fifo_fails_the_reload_instead_of_hanging_it(daemon_factory, served_and_target):
    root, served, target = served_and_target
    fifo = os.path.join(root, "pipe")
    os.mkfifo(fifo)
    shard = os.path.join(target, "model.safetensors")
    os.unlink(shard)
    os.symlink(fifo, shard)  # inside the root, so only its kind stops it
    daemon = daemon_factory("--checkpoint", served, "--reload-root", root)
    daemon.wait_state("ready")
    reload = failed_reload(daemon, target)
    assert shard in reload["error"] and "FIFO" in reload["error"], reload
    # The next reload is not refused as "already in progress": nothing was left blocked.
    os.unlink(shard)
    write_checkpoint(target, vocab_size=300, head_dim=128, seed=2)
    again = daemon.connection.request("reload", {"checkpoint": target})["generation"]
    wait_for(lambda: (s := daemon.status())["generation"] == again and s["state"] == "ready",
             "the repaired checkpoint to be served", 60)


def test_a_shard_linked_out_of_the_root_is_not_read_nor_echoed(daemon_factory, served_and_target, tmp_path):
    root, served, target = served_and_target
    secret = tmp_path / "shadow"
    secret.write_bytes(SECRET)
    os.chmod(secret, 0o600)
    shard = os.path.join(target, "model.safetensors")
    os.unlink(shard)
    os.symlink(str(secret), shard)
    daemon = daemon_factory("--checkpoint", served, "--reload-root", root)
    daemon.wait_state("ready")
    reload = failed_reload(daemon, target)
    assert shard in reload["error"] and "outside the checkpoint's root" in reload["error"], reload
    (as_length,) = struct.unpack("<Q", SECRET[:8])
    text = repr(daemon.status())
    for number in (as_length, len(SECRET)):  # as a number of its own: a random hex id may hold its digits
        assert not re.search(rf"(?<![0-9A-Za-z.]){number}(?![0-9A-Za-z.])", text), \
            f"{number} from the file outside the root is in status"
    for leaked in (str(secret), "root:$6$"):
        assert leaked not in text, f"{leaked!r} from the file outside the root is in status"


def test_a_tokenizer_linked_to_dev_zero_is_refused_without_reading_it(daemon_factory, served_and_target):
    root, served, target = served_and_target
    tokenizer = os.path.join(target, "tokenizer.json")
    os.unlink(tokenizer)
    os.symlink("/dev/zero", tokenizer)
    daemon = daemon_factory("--checkpoint", served, "--reload-root", "/")  # /dev/zero lies under this root
    daemon.wait_state("ready")
    before = rss_bytes(daemon.proc.pid)
    reload = failed_reload(daemon, target)
    assert tokenizer in reload["error"] and "character device" in reload["error"], reload
    assert rss_bytes(daemon.proc.pid) - before < 256 * 2**20


def test_a_huge_tokenizer_is_refused_by_its_size(daemon_factory, served_and_target):
    root, served, target = served_and_target
    tokenizer = os.path.join(target, "tokenizer.json")
    os.truncate(tokenizer, 1 << 40)  # a regular file of 1 TiB, a hole after the real JSON
    try:
        daemon = daemon_factory("--checkpoint", served, "--reload-root", root)
        daemon.wait_state("ready")
        before = rss_bytes(daemon.proc.pid)
        reload = failed_reload(daemon, target)
        assert tokenizer in reload["error"] and str(1 << 40) in reload["error"] and "accepts" in reload["error"]
        assert rss_bytes(daemon.proc.pid) - before < 256 * 2**20
    finally:
        os.unlink(tokenizer)  # pytest keeps old tmp dirs: leave no 1 TiB of apparent size there


def test_links_that_stay_inside_the_root_are_followed(daemon_factory, served_and_target):
    root, served, target = served_and_target
    blobs = os.path.join(root, "blobs")  # as a snapshot directory links to the blobs beside it
    os.makedirs(blobs)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        os.rename(os.path.join(target, name), os.path.join(blobs, name))
        os.symlink(os.path.join("..", "blobs", name), os.path.join(target, name))
    daemon = daemon_factory("--checkpoint", served, "--reload-root", root)
    daemon.wait_state("ready")
    daemon.connection.request("reload", {"checkpoint": target})
    status = wait_for(lambda: (s := daemon.status())["generation"] == 2 and s["state"] == "ready" and s,
                      "the linked checkpoint to be served", 60)
    assert status["hashing"] is not None and status["checkpoint"] == target
