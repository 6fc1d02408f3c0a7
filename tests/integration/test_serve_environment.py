"""``serve`` and ``serve --print-config`` take the settings alike: what one refuses the other
refuses in the same words, ``--print-config`` shows the values a started daemon uses (not
``(unset)``), and an ``ENGRAMD_*`` variable nothing reads, or an empty one ``serve`` reads, is
named (refused; an empty ENGRAMD_CHECKPOINT serves the demo table with a warning).  engramd runs
as a real process; the values shown are compared with a real daemon's status.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from engram_client.attach.connection import DaemonConnection
from engram_client.attach.readiness import wait_ready
from engram_client.core.demo_rows import DEMO_VOCAB_SIZE
from engram_client.core.variables import READERS
from engram_client.tools.serve_process import launch_serve
from engramd.cli.settings import SETTINGS
from waiting import end_process

PROCESS_TIMEOUT_S = 60
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MISSPELLED = "ENGRAMD_" + "CHECKPIONT"  # spelled apart, so that the scan of the tree below does not find it


def engramd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAMD_")}
    return subprocess.run([sys.executable, "-m", "engramd", *args], capture_output=True, text=True,
                          timeout=PROCESS_TIMEOUT_S, env={**environment, **(env or {})})


def printed(result: subprocess.CompletedProcess) -> dict[str, tuple[str, str]]:
    """``--print-config``'s lines: setting -> (value as printed, where it came from)."""
    assert result.returncode == 0, result.stderr
    lines = {}
    for line in result.stdout.splitlines():
        setting, _, rest = line.lstrip("# ").partition(" = ")
        value, _, comment = rest.partition("  # ")
        lines[setting] = (value, comment)
    return lines


@pytest.mark.parametrize("args, env, names", [
    (["--gather-cpus", "4000"], {}, "--gather-cpus 4000: CPUs 4000 are not among"),
    ([], {"ENGRAMD_LOAD_THREADS": "0"}, "ENGRAMD_LOAD_THREADS must be 1..256"),
    (["--numa-replicas", "x"], {}, "--numa-replicas 'x': 'x' is not a NUMA node number or a range like 0-1"),
])
def test_print_config_refuses_what_serve_refuses(args, env, names, shm_dir, socket_dir):
    where = ["--socket", f"ipc://{socket_dir}/s.sock", "--shm-dir", shm_dir, *args]
    served, shown = engramd("serve", *where, env=env), engramd("serve", "--print-config", *where, env=env)
    assert served.returncode == shown.returncode == 1, shown.stdout + shown.stderr
    assert served.stderr == shown.stderr and names in shown.stderr, shown.stderr
    assert shown.stdout == "", shown.stdout


def test_print_config_shows_what_the_daemon_uses(daemon_factory, shm_dir, socket_dir):
    daemon = daemon_factory()
    budget = daemon.wait_state("ready")["gather_budget"]
    shown = printed(engramd("serve", "--print-config", "--socket", daemon.endpoint, "--shm-dir", shm_dir))
    cpus = ",".join(group["cpus"] for group in budget["groups"])
    assert shown["gather_cpus"] == (json.dumps(cpus), "default; resolved from unset"), shown["gather_cpus"]
    assert shown["demo_vocab_size"] == (str(DEMO_VOCAB_SIZE), "default; resolved from unset")
    assert not any(value == "(unset)" for name, (value, _) in shown.items()
                   if name in ("gather_cpus", "demo_vocab_size", "progress")), shown


def test_an_unknown_variable_is_refused_by_name(shm_dir, socket_dir):
    where = ["--socket", f"ipc://{socket_dir}/s.sock", "--shm-dir", shm_dir]
    for args in (["serve", *where], ["serve", "--print-config", *where]):
        result = engramd(*args, env={MISSPELLED: "/models/x"})
        assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
        (line,) = result.stderr.splitlines()
        assert f"environment variable {MISSPELLED}: no part of engramd reads it" in line, line
        assert "did you mean ENGRAMD_CHECKPOINT?" in line, line


@pytest.mark.parametrize("name", ["ENGRAMD_GROUP", "ENGRAMD_LOAD_THREADS", "ENGRAMD_SOCKET", "ENGRAMD_CONFIG"])
def test_an_empty_setting_variable_is_refused_by_name(name, shm_dir):
    for args in (["serve", "--shm-dir", shm_dir], ["serve", "--print-config", "--shm-dir", shm_dir]):
        result = engramd(*args, env={name: ""})
        assert result.returncode == 2, result.stdout + result.stderr
        assert f"environment variable {name} is set but empty" in result.stderr, result.stderr


def test_the_variables_other_parts_read_are_not_refused(shm_dir, socket_dir):
    env = {name: "0" for name in READERS if name != "ENGRAMD_CONFIG"}
    env["ENGRAMD_SOCKET"] = f"ipc://{socket_dir}/s.sock"
    shown = printed(engramd("serve", "--print-config", "--shm-dir", shm_dir, env=env))
    assert shown["socket"][1] == "environment (ENGRAMD_SOCKET)", shown["socket"]


def test_an_empty_checkpoint_variable_serves_the_demo_with_a_warning_naming_it(shm_dir, socket_dir):
    shown = printed(engramd("serve", "--print-config", "--shm-dir", shm_dir, env={"ENGRAMD_CHECKPOINT": ""}))
    assert "ENGRAMD_CHECKPOINT is set but empty: no checkpoint, the demo table is served" in shown["checkpoint"][1]
    log = os.path.join(socket_dir, "daemon.log")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ENGRAMD_")}, "ENGRAMD_CHECKPOINT": ""}
    endpoint = f"ipc://{socket_dir}/s.sock"
    with open(log, "wb") as output:
        daemon = launch_serve(endpoint, shm_dir, log_level="info", output=output, env=env)
    try:
        connection = DaemonConnection(endpoint)
        try:
            assert wait_ready(connection, PROCESS_TIMEOUT_S, daemon=daemon)["checkpoint"] == "<demo>"
        finally:
            connection.close()
    finally:
        end_process(daemon)
    with open(log) as f:
        text = f.read()
    assert re.search(r"WARNING .*ENGRAMD_CHECKPOINT is set but empty: no checkpoint, the demo table is served",
                     text), text


def test_every_engramd_variable_the_tree_names_is_known():
    """One list: a variable a source, a doc or a manifest names is a setting's or in READERS."""
    known = {setting.envvar for setting in SETTINGS} | set(READERS)
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    named: dict[str, str] = {}
    for path in files:
        try:
            with open(os.path.join(REPO, path), encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        for name in re.findall(r"\bENGRAMD_[A-Z0-9_]+\b", text):
            named.setdefault(name, path)
    unknown = {name: path for name, path in named.items() if name not in known}
    assert not unknown, unknown
