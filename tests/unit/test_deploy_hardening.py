"""The node service's sandbox and the DaemonSet's security fields, read from the files."""
from __future__ import annotations

import os
import shlex

import pytest

yaml = pytest.importorskip("yaml")

DEPLOY = os.path.join(os.path.dirname(__file__), "..", "..", "deploy")
UNIT = os.path.join(DEPLOY, "systemd", "engramd.service")
DAEMONSET = os.path.join(DEPLOY, "kubernetes", "engramd-daemonset.yaml")


def unit_service() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    section = None
    with open(UNIT) as f:
        for line in f:
            line = line.strip()
            if line.startswith("["):
                section = line.strip("[]")
            elif line and not line.startswith(("#", ";")) and section == "Service":
                key, _, value = line.partition("=")
                settings.setdefault(key, []).append(value)
    return settings


def test_unit_runs_sandboxed_as_its_own_user():
    service = unit_service()
    assert service["User"] == ["engramd"] and service["NoNewPrivileges"] == ["yes"]
    assert service["ProtectSystem"] == ["strict"] and service["ReadWritePaths"] == ["/dev/shm"]
    assert service["ProtectHome"] == ["yes"] and service["PrivateTmp"] == ["yes"]
    families = set(service["RestrictAddressFamilies"][0].split())
    assert "AF_UNIX" in families and families <= {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert int(service["LimitNOFILE"][0]) >= 65536 and service["LimitMEMLOCK"] == ["infinity"]
    assert int(service["WatchdogSec"][0]) > 0


def test_unit_never_passes_an_empty_checkpoint_on_the_command_line():
    (exec_start,) = unit_service()["ExecStart"]
    argv = shlex.split(exec_start)
    assert "--checkpoint" not in argv and not any("${" in part or "$" in part for part in argv)


def test_daemonset_pod_is_locked_down_and_declares_its_metrics_port():
    with open(DAEMONSET) as f:
        daemonset = next(doc for doc in yaml.safe_load_all(f) if doc and doc.get("kind") == "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = [c for c in pod["containers"] if c["name"] == "engramd"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    command = container["command"]
    assert str(ports["metrics"]) == command[command.index("--metrics-port") + 1]
