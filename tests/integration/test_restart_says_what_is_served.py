"""After ``reload --checkpoint B``, a restart with the old ``--checkpoint A`` serves B (the served
record, by design); ``serve --print-config`` and the daemon's log say so, and going back to A
is what they say it is.  Real daemons, real checkpoints, the CLI as processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engramd.synth.writer import write_checkpoint

PROCESS_TIMEOUT_S = 60


@pytest.fixture
def two_checkpoints(tmp_path):
    a, b = (os.path.realpath(str(tmp_path / "ckpts" / name)) for name in ("a", "b"))
    write_checkpoint(a, vocab_size=400, head_dim=128, seed=1)
    write_checkpoint(b, vocab_size=400, head_dim=128, seed=2)
    return a, b


def engramd(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAMD_")}
    return subprocess.run([sys.executable, "-m", "engramd", *args], capture_output=True, text=True,
                          timeout=PROCESS_TIMEOUT_S, env=env)


def printed_checkpoint(daemon, checkpoint: str) -> tuple[str | None, str]:
    """The checkpoint line of ``serve --print-config`` for this daemon's socket and shm dir: value, comment."""
    result = engramd("serve", "--print-config", "--checkpoint", checkpoint, "--socket", daemon.endpoint,
                     "--shm-dir", daemon.shm_dir)
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.lstrip("# ").startswith("checkpoint = ")]
    value, _, comment = line.partition("  # ")
    return json.loads(value.partition(" = ")[2]), comment


def test_a_restart_with_the_old_checkpoint_says_it_serves_the_reloaded_one(daemon_factory, two_checkpoints):
    a, b = two_checkpoints
    daemon = daemon_factory("--checkpoint", a)
    daemon.wait_state("ready")
    assert printed_checkpoint(daemon, a)[0] == a
    reloaded = engramd("reload", "--socket", daemon.endpoint, "--checkpoint", b, "--wait", "60")
    assert reloaded.returncode == 0, reloaded.stderr
    daemon.stop()

    value, comment = printed_checkpoint(daemon, a)
    assert value == b, comment  # what a start now serves, not what --checkpoint says
    assert f"started from --checkpoint {a} was reloaded onto it" in comment, comment
    assert f"`engramd reload --checkpoint {a}` goes back to it" in comment, comment

    again = daemon_factory("--checkpoint", a)
    assert again.wait_state("ready")["checkpoint"] == b
    warnings = [line for line in again.log().splitlines() if " WARNING " in line and "serving " in line]
    assert any(f"serving {b}, not --checkpoint {a}: " in line for line in warnings), again.log()

    back = engramd("reload", "--socket", again.endpoint, "--checkpoint", a, "--wait", "60")
    assert back.returncode == 0, back.stderr
    assert printed_checkpoint(again, a) == (a, "command line")


def test_the_daemonsets_configmap_says_what_a_restart_serves():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "kubernetes", "engramd-daemonset.yaml")
    lines = open(path).read().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("ENGRAMD_CHECKPOINT:"))
    comment = []
    for line in reversed(lines[:at]):
        if not line.strip().startswith("#"):
            break
        comment.insert(0, line.strip().lstrip("# "))
    text = " ".join(comment)
    assert "still serves (re-adopts) B although this names the old one" in text, text
    assert "--print-config" in text and "loads this one again" not in text, text
