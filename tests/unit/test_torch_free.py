"""The daemon side installs without torch: engramd and the shared core import in an environment without it.

The subprocess runs with tests/support/torchless_site's sitecustomize, which makes ``import torch``
(and triton, safetensors, cuda) raise ImportError, as on a daemon-only install.
"""
from __future__ import annotations

import ast
import os
import pkgutil

import engramd
from torchless import run_torchless

# engramd modules that need the client or synth extra and are imported lazily by the CLI.
NEEDS_EXTRAS = {"engramd.synth.writer"}
# What engramd may import from engram_client at module level (lazily, a command may import the tools).
ALLOWED_CLIENT_MODULES = ("engram_client.core", "engram_client.attach.connection", "engram_client.attach.readiness",
                          "engram_client.attach.daemon_probe")


def engramd_modules() -> list[str]:
    names = ["engramd"] + [info.name for info in pkgutil.walk_packages(engramd.__path__, "engramd.")]
    return [name for name in names if name not in NEEDS_EXTRAS and not name.endswith("__main__")]


def test_the_blocker_really_blocks_torch():
    result = run_torchless("import torch")
    assert result.returncode != 0 and "ImportError" in result.stderr


def test_every_daemon_module_imports_without_torch():
    modules = engramd_modules() + ["engram_client", "engram_client.core.protocol", "engram_client.core.endpoints",
                                   "engram_client.core.table_file", "engram_client.core.hashing_section",
                                   "engram_client.core.layout",
                                   "engram_client.core.errors", "engram_client.core.demo_rows",
                                   "engram_client.attach.connection", "engram_client.attach.readiness", "engram_client.attach.daemon_probe",
                                   "engram_client.tools.serve_process"]
    assert "engramd.cli.main" in modules and "engramd.daemon.server" in modules and "engramd.daemon.state_machine" in modules
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "heavy = sorted(m for m in sys.modules if m.partition('.')[0] in ('torch', 'triton', 'safetensors'))\n"
            "print('loaded:', heavy)\n")
    result = run_torchless(code)
    assert result.returncode == 0, result.stderr
    assert "loaded: []" in result.stdout


def test_demo_without_torch_names_the_extra_to_install():
    code = ("import sys\nfrom click.testing import CliRunner\nfrom engramd.cli.main import main\n"
            "for command in ('demo', 'bench'):\n"
            "    result = CliRunner().invoke(main, [command])\n"
            "    print(command, result.exit_code, repr(result.output))\n")
    result = run_torchless(code)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    extras = {"demo": "engramd[client]", "bench": "engramd[gpu]"}  # bench runs the GPU lookup paths
    for line in lines:
        command, code_text, output = line.split(" ", 2)
        assert code_text == "1", line
        assert "error:" in output and extras[command] in output, line


def test_engramd_imports_only_the_shared_core_from_the_client_package():
    root = os.path.dirname(engramd.__file__)
    offenders = []
    for directory, _, files in os.walk(root):
        for file in files:
            if not file.endswith(".py"):
                continue
            path = os.path.join(directory, file)
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            for node in tree.body:  # module level only: commands import the rank-side tools lazily
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                    [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
                for name in names:
                    if name.startswith("engram_client") and not name.startswith(ALLOWED_CLIENT_MODULES):
                        offenders.append(f"{os.path.relpath(path, root)}: {name}")
                    if name.partition(".")[0] in ("torch", "triton") and not path.endswith("synth/writer.py"):
                        offenders.append(f"{os.path.relpath(path, root)}: {name}")
    assert offenders == []
