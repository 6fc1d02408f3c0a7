"""A daemon-only install: ``engramd serve``, ``status`` and ``stop`` run as real processes without torch,
and a command that needs an extra names it in one ``error:`` line."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from engram_client.tools.serve_process import launch_serve
from torchless import torchless_env

PROCESS_TIMEOUT_S = 60


def engramd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engramd", *args], env=torchless_env(), capture_output=True,
                          text=True, timeout=PROCESS_TIMEOUT_S)


def test_serve_status_stop_without_torch(socket_dir, shm_dir):
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    with open(os.path.join(socket_dir, "engramd.log"), "wb") as log:
        daemon = launch_serve(endpoint, shm_dir, log_level="info", output=log, env=torchless_env())
    try:
        status = engramd("status", "--socket", endpoint, "--wait", "30", "--json")
        assert status.returncode == 0, status.stderr
        assert '"state": "ready"' in status.stdout
        assert any(name.endswith(".table") for name in os.listdir(shm_dir))
        stopped = engramd("stop", "--socket", endpoint)
        assert stopped.returncode == 0, stopped.stderr
        assert "engramd stopped" in stopped.stdout
        assert daemon.wait(timeout=PROCESS_TIMEOUT_S) == 0
        assert not any(name.endswith(".table") for name in os.listdir(shm_dir))
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(timeout=10)
    with open(os.path.join(socket_dir, "engramd.log"), errors="replace") as f:
        assert "Traceback" not in f.read()


def only_error_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.splitlines()
    assert result.returncode == 1, result.stdout + result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("args, extra", [
    (["demo"], "engramd demo needs torch, which is not installed: install the client extra "
               "(pip install 'engramd[client]')"),
    (["bench"], "engramd bench needs torch, which is not installed: install the gpu extra (pip install 'engramd[gpu]'"),
    (["synth", "{out}"], "engramd synth needs torch, which is not installed: install the synth extra "
                         "(pip install 'engramd[synth]')"),
])
def test_a_command_that_needs_an_extra_names_it_in_one_line(args, extra, tmp_path):
    out = tmp_path / "ckpt"
    line = only_error_line(engramd(*(arg.format(out=out) for arg in args)))
    assert line.startswith(f"error: {extra}"), line
    assert not out.exists(), "a refused synth wrote files"


def test_an_extra_missing_deeper_in_a_command_is_one_line_too():
    # A command of the real group whose module imports torch only once it runs (as a kernel's Triton would).
    code = ("import sys\nimport click\nfrom engramd.cli.main import main\n"
            "@main.command()\ndef lookup():\n    import torch  # noqa: F401\n"
            "main(['lookup'], prog_name='engramd')\n")
    result = subprocess.run([sys.executable, "-c", code], env=torchless_env(), capture_output=True, text=True,
                            timeout=PROCESS_TIMEOUT_S)
    line = only_error_line(result)
    assert line == ("error: engramd lookup needs torch, which is not installed: install the client extra "
                    "(pip install 'engramd[client]')"), line
