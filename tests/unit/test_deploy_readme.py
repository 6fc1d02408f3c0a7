"""deploy/kubernetes/README.md against the manifests beside it: the parts the manifests decide are
written from them (deploy/kubernetes/build_readme.py) and must be what that script writes now;
the figures in the prose around them (paths, probe budgets, memory and huge-page sizes, the
retire grace) must be the manifests'.  Reads files; starts nothing.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

yaml = pytest.importorskip("yaml")

from test_deploy_manifests import _daemon, _environment, _serve_argv, _option, quantity  # noqa: E402

K8S = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "kubernetes")
with open(os.path.join(K8S, "README.md")) as _f:
    README = _f.read()


def test_the_generated_parts_are_what_the_manifests_say():
    result = subprocess.run([sys.executable, os.path.join(K8S, "build_readme.py"), "--check"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "/dev/hugepages/engramd/" in README.split("## Layout on the node")[1].split("##")[0]


def test_every_serve_socket_and_shm_dir_the_readme_gives_is_the_daemonsets():
    argv = _serve_argv()
    socket, shm_dir = _option(argv, "--socket"), _option(argv, "--shm-dir")
    sockets = re.findall(r"--socket (ipc://[^\s`;)]+)", README)
    assert sockets and set(sockets) == {socket}, sockets
    shm_dirs = re.findall(r"--shm-dir (/[^\s`;)]+)", README)
    assert shm_dirs and set(shm_dirs) == {shm_dir}, shm_dirs


def test_probe_budgets_are_the_daemonsets():
    _, _, container = _daemon()
    for probe, row in (("startupProbe", "startup"), ("readinessProbe", "readiness"), ("livenessProbe", "liveness")):
        spec = container[probe]
        budget = f"{spec['failureThreshold']} × {spec['periodSeconds']} s"
        assert re.search(rf"^\| {row} \|.*\| {re.escape(budget)}\b", README, re.M), (row, budget)


def test_sizes_in_the_prose_are_the_daemonsets():
    ds, _, container = _daemon()
    reservation = quantity(ds["spec"]["template"]["metadata"]["annotations"]["engramd/table-reservation"])
    memory = quantity(container["resources"]["requests"]["memory"])
    huge = quantity(container["resources"]["limits"]["hugepages-2Mi"])
    gi = 2**30
    # the tmpfs variant: one generation plus the process's memory, two plus it
    assert f"plus the {memory // gi}Gi above ({(reservation + memory) // gi}Gi for V4.1)" in README
    assert f"plus {memory // gi}Gi\n({(2 * reservation + memory) // gi}Gi)" in README
    assert f"hugepages={huge // (2 * 2**20)}`" in README  # the boot reservation that hugepages-2Mi takes
    assert f"the daemon container asks for `hugepages-2Mi: {container['resources']['limits']['hugepages-2Mi']}`" \
        in " ".join(README.split())
    grace = _environment(container)["ENGRAMD_RETIRE_GRACE_SECONDS"]
    assert f"`--retire-grace-seconds` ({grace} s here)" in README
