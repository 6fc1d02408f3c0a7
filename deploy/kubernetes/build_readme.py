"""Write the parts of README.md beside this file that the manifests decide; `--check` says whether
they are up to date.

    engramd-daemonset.yaml + engine-pod-example.yaml  ->  README.md, "Layout on the node" (the node's
                                                          directories, as the pods mount them)
    engramd-daemonset.yaml                            ->  README.md, "What the daemon's container asks
                                                          for" (its resources and the table reservation)

Each part stands between a ``<!-- generated: NAME ... -->`` line and ``<!-- end generated: NAME -->``;
the prose around it is written by hand, and tests/unit/test_deploy_readme.py checks its figures
against the manifests.  Needs PyYAML (the test extra has it).
"""
from __future__ import annotations

import os
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
README = os.path.join(HERE, "README.md")
DAEMONSET = os.path.join(HERE, "engramd-daemonset.yaml")
ENGINE = os.path.join(HERE, "engine-pod-example.yaml")
RESERVATION_ANNOTATION = "engramd/table-reservation"


def documents(path: str) -> list[dict]:
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def one(path: str, kind: str) -> dict:
    (found,) = [doc for doc in documents(path) if doc["kind"] == kind]
    return found


def daemon() -> tuple[dict, dict, dict, dict]:
    """(DaemonSet, its pod spec, the `engramd serve` container, the ConfigMap's data)."""
    ds = one(DAEMONSET, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (container,) = [c for c in spec["containers"] if c.get("command", [])[:2] == ["engramd", "serve"]]
    return ds, spec, container, one(DAEMONSET, "ConfigMap").get("data", {})


def option(container: dict, name: str, config: dict) -> str:
    argv = [str(part) for part in container["command"] + container.get("args", [])]
    value = argv[argv.index(name) + 1]
    for key, text in config.items():  # Kubernetes' $(VAR) expansion from the ConfigMap
        value = value.replace(f"$({key})", str(text))
    return value


def host_path(spec: dict, container: dict, path: str) -> tuple[str, dict]:
    """The node path behind ``path`` in ``container``, and its mount."""
    mounts = [m for m in container["volumeMounts"] if path == m["mountPath"] or path.startswith(m["mountPath"] + "/")]
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    return volume["hostPath"]["path"] + path[len(mount["mountPath"]):], mount


def layout() -> str:
    _, spec, container, config = daemon()
    engine = one(ENGINE, "Pod")["spec"]
    (rank,) = [c for c in engine["containers"] if any(e.get("name") == "ENGRAMD_SOCKET" for e in c.get("env", []))]
    checkpoint, shm, socket = (option(container, flag, config) for flag in ("--checkpoint", "--shm-dir", "--socket"))
    socket_path = socket[len("ipc://"):]
    node_checkpoint, checkpoint_mount = host_path(spec, container, checkpoint)
    node_shm, _ = host_path(spec, container, shm)
    node_sockets, _ = host_path(spec, container, os.path.dirname(socket_path))
    engine_shm = next(m for m in rank["volumeMounts"] if m["mountPath"] == shm)
    name = os.path.basename(socket_path)
    rows = [
        ("node", ""),
        (f"├── {node_checkpoint}/", "checkpoint (hostPath, " + ("read-only" if checkpoint_mount.get("readOnly")
                                                               else "read-write") + " in the daemon's pod)"),
        (f"├── {node_shm}/", f"the table's directory (--shm-dir {shm}; hostPath)"),
        ("│   ├── engramd-<id>-g1.table", f"at {shm} in the daemon's pod (read-write)"),
        ("│   ├── engramd-<id>.served", "and in every engine pod (" + ("read-only" if engine_shm.get("readOnly")
                                                                         else "read-write") + ")"),
        ("│   └── engramd-<id>.lock", ""),
        (f"└── {node_sockets}/", "the daemon's sockets (hostPath)"),
        (f"    ├── {name}", f"requests (ENGRAMD_SOCKET={socket})"),
        (f"    ├── {name}.events", "state events"),
        (f"    ├── {name}.budget", "the node's gather budget"),
        (f"    └── {name}.lock", ""),
    ]
    return "```\n" + "\n".join(f"{left:<34}{right}".rstrip() for left, right in rows) + "\n```"


def resources() -> str:
    ds, _, container, _ = daemon()
    reservation = ds["spec"]["template"]["metadata"]["annotations"][RESERVATION_ANNOTATION]
    asked = container["resources"]
    lines = ["| resource | request | limit |", "| --- | --- | --- |"]
    for name in sorted(set(asked.get("requests", {})) | set(asked.get("limits", {}))):
        lines.append(f"| `{name}` | {asked.get('requests', {}).get(name, '-')} | {asked.get('limits', {}).get(name, '-')} |")
    lines.append(f"| annotation `{RESERVATION_ANNOTATION}` (one generation) | {reservation} | |")
    return "\n".join(lines)


PARTS = {"layout": layout, "resources": resources}


def rewritten(text: str) -> str:
    for name, make in PARTS.items():
        begin, end = f"<!-- generated: {name} ", f"<!-- end generated: {name} -->"
        start = text.index(begin)
        body_start = text.index("\n", start) + 1
        stop = text.index(end, body_start)
        text = text[:body_start] + make() + "\n" + text[stop:]
    return text


def main(argv: list[str]) -> int:
    with open(README) as f:
        text = f.read()
    wanted = rewritten(text)
    if "--check" in argv:
        if wanted != text:
            print(f"{README} is not what the manifests say: run python3 {os.path.relpath(__file__)}")
            return 1
        return 0
    with open(README, "w") as f:
        f.write(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
