"""The deployment files: the settings that decide whether engine ranks can reach the table.

Reads deploy/kubernetes/*.yaml (every document) and deploy/systemd/engramd.service as files;
starts nothing.  What must hold: the daemon serves on a socket and an shm dir that engine pods
mount at the same paths; its probes ask the same socket; its memory covers the table its
tmpfs pages are charged for; no image floats on `latest`.
"""
from __future__ import annotations

import glob
import os
import re
import shlex
from fractions import Fraction

import pytest

from engram_client.core.layout import LayerLayout
from engram_client.core.table_file import TableHeader

yaml = pytest.importorskip("yaml")

DEPLOY = os.path.join(os.path.dirname(__file__), "..", "..", "deploy")
K8S = os.path.join(DEPLOY, "kubernetes")
UNIT = os.path.join(DEPLOY, "systemd", "engramd.service")
RESERVATION_ANNOTATION = "engramd/table-reservation"
# DeepSeek-V4.1: two Engram layers of these many rows, 256-wide (docs/checkpoint.md).
V41_ROWS = (384_006_168, 384_016_682)

_SUFFIXES = {"": 1, "m": Fraction(1, 1000), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
             "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E))?$")


def quantity(value) -> Fraction:
    """A Kubernetes resource quantity ("192Gi", "200G", "1.5Gi", "100m", "1e3", 8) as an exact number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Fraction(value)
    match = _QUANTITY.match(str(value).strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    number, exponent, suffix = match.groups()
    if exponent:
        return Fraction(number) * Fraction(10) ** int(exponent[1:])
    return Fraction(number) * _SUFFIXES[suffix or ""]


def test_quantity_parser():
    assert quantity("192Gi") == 192 * 2**30
    assert quantity("200G") == 200 * 10**9
    assert quantity("1.5Gi") == 3 * 2**29
    assert quantity("512Mi") == 2**29
    assert quantity("100m") == Fraction(1, 10)
    assert quantity("1e3") == 1000
    assert quantity(8) == 8
    assert quantity("8") == 8
    for bad in ("192 GiB", "Gi", "1.2.3", "12X"):
        with pytest.raises(ValueError):
            quantity(bad)


# -- reading the manifests -------------------------------------------------------------------

def _documents() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(glob.glob(os.path.join(K8S, "*.yaml"))):
        with open(path) as f:
            docs.extend((os.path.basename(path), doc) for doc in yaml.safe_load_all(f) if doc is not None)
    return docs


DOCS = _documents()


def _one(kind: str, file: str) -> dict:
    found = [doc for name, doc in DOCS if name == file and doc["kind"] == kind]
    assert len(found) == 1, f"{file}: expected one {kind}, found {len(found)}"
    return found[0]


def _pod_spec(doc: dict) -> dict:
    return doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]


def _argv(container: dict) -> list[str]:
    return [str(part) for part in (container.get("command") or []) + (container.get("args") or [])]


def _option(argv: list[str], name: str) -> str | None:
    for i, part in enumerate(argv):
        if part == name and i + 1 < len(argv):
            return argv[i + 1]
        if part.startswith(name + "="):
            return part[len(name) + 1:]
    return None


def _is_under(path: str, directory: str) -> bool:
    path, directory = os.path.normpath(path), os.path.normpath(directory)
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _mount_for(container: dict, path: str) -> dict:
    """The volume mount that holds ``path`` in ``container`` (the deepest one, as mounts nest)."""
    mounts = [m for m in container.get("volumeMounts", []) if _is_under(path, m["mountPath"])]
    assert mounts, f"container {container['name']}: nothing is mounted at or above {path}"
    return max(mounts, key=lambda m: len(os.path.normpath(m["mountPath"])))


def _volume(spec: dict, name: str) -> dict:
    return next(v for v in spec["volumes"] if v["name"] == name)


def _config_maps() -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc.get("data", {}) for _, doc in DOCS if doc["kind"] == "ConfigMap"}


def _environment(container: dict) -> dict[str, str]:
    """The container's environment as Kubernetes builds it: envFrom ConfigMaps, then env."""
    env: dict[str, str] = {}
    maps = _config_maps()
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        assert name in maps, f"container {container['name']} reads ConfigMap {name}, which no manifest defines"
        env.update(maps[name])
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    return env


def _expand(argv: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion in command and args; an unknown variable is a mistake here."""
    def one(match):
        assert match.group(1) in env, f"$({match.group(1)}) is not in the container's environment"
        return env[match.group(1)]
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, part) for part in argv]


def _daemon() -> tuple[dict, dict, dict]:
    """(DaemonSet, its pod spec, the container running `engramd serve`)."""
    ds = _one("DaemonSet", "engramd-daemonset.yaml")
    spec = _pod_spec(ds)
    serving = [c for c in spec["containers"] if _argv(c)[:2] == ["engramd", "serve"]]
    assert len(serving) == 1, "the DaemonSet must run exactly one `engramd serve` container"
    return ds, spec, serving[0]


def _engine() -> tuple[dict, dict]:
    pod = _one("Pod", "engine-pod-example.yaml")
    spec = _pod_spec(pod)
    engines = [c for c in spec["containers"] if any(e.get("name") == "ENGRAMD_SOCKET" for e in c.get("env", []))]
    assert len(engines) == 1, "the engine example must have one container that sets ENGRAMD_SOCKET"
    return spec, engines[0]


def _serve_argv() -> list[str]:
    _, _, container = _daemon()
    return _expand(_argv(container), _environment(container))


def _socket_path() -> str:
    endpoint = _option(_serve_argv(), "--socket")
    assert endpoint is not None and endpoint.startswith("ipc:///"), f"--socket {endpoint!r}: an absolute ipc:// path"
    return endpoint[len("ipc://"):]


def _shm_dir() -> str:
    shm_dir = _option(_serve_argv(), "--shm-dir")
    assert shm_dir is not None and os.path.isabs(shm_dir), f"--shm-dir {shm_dir!r}: an absolute path"
    return shm_dir


# -- the tests ----------------------------------------------------------------------------

def test_every_document_names_its_kind_and_api_version():
    assert {name for name, _ in DOCS} == {"engramd-daemonset.yaml", "engine-pod-example.yaml",
                                          "engramd-podmonitor.yaml", "engramd-prometheusrule.yaml"}
    for name, doc in DOCS:
        assert isinstance(doc, dict) and doc.get("apiVersion") and doc.get("kind"), name
        assert doc.get("metadata", {}).get("name"), f"{name}: a {doc.get('kind')} without a name"


def test_daemonset_is_apps_v1_and_selects_its_own_pods():
    ds, spec, _ = _daemon()
    assert ds["apiVersion"] == "apps/v1"
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert not spec.get("hostIPC"), "the table is a file and the sockets are paths: no hostIPC"
    # SIGTERM waits up to 60 s for a load thread to stop (engramd/daemon/state_machine.py): give it that and more.
    assert spec["terminationGracePeriodSeconds"] >= 60


def test_daemon_serves_its_socket_and_table_from_node_directories():
    _, spec, container = _daemon()
    argv = _serve_argv()
    for path, what in ((os.path.dirname(_socket_path()), "socket dir"), (_shm_dir(), "shm dir")):
        mount = _mount_for(container, path)
        assert not mount.get("readOnly"), f"the daemon writes its {what} {path}"
        volume = _volume(spec, mount["name"])
        # Engine pods must open these too: only a node path can be shared between pods.
        assert "hostPath" in volume, f"{what} {path} is on volume {mount['name']}, which is not a hostPath"
        assert volume["hostPath"].get("type") in ("Directory", "DirectoryOrCreate")
    checkpoint = _option(argv, "--checkpoint")
    assert checkpoint is not None, "serve without --checkpoint would serve the demo table"
    assert _mount_for(container, checkpoint).get("readOnly") is True, "the checkpoint is mounted read-only"


def test_probes_ask_the_daemon_on_its_own_socket():
    _, _, container = _daemon()
    endpoint = "ipc://" + _socket_path()

    def status_argv(probe: str) -> list[str]:
        command = [str(part) for part in container[probe]["exec"]["command"]]
        if command[:2] == ["sh", "-c"]:
            command = shlex.split(command[2].split(";")[0].split(">")[0])
        assert command[:2] == ["engramd", "status"], f"{probe} runs {command}"
        assert _option(command, "--socket") == endpoint, f"{probe} asks another socket than {endpoint}"
        return command

    readiness = status_argv("readinessProbe")
    assert _option(readiness, "--wait") is None, "readiness answers now: exit 0 iff ready"
    startup = container["startupProbe"]
    status_argv("startupProbe")
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600, "a first load takes minutes"
    status_argv("livenessProbe")
    script = container["livenessProbe"]["exec"]["command"][2]
    # `engramd status` exits 1 while loading: liveness must fail only on 3 (no answer).
    assert re.search(r"test \$\? -ne 3\s*$", script), f"liveness must tolerate loading: {script!r}"


def test_engine_mounts_the_socket_dir_and_the_shm_dir_at_the_daemons_paths():
    _, daemon_spec, daemon = _daemon()
    engine_spec, engine = _engine()
    for path, what in ((os.path.dirname(_socket_path()), "socket dir"), (_shm_dir(), "shm dir")):
        daemon_mount = _mount_for(daemon, path)
        node_path = _volume(daemon_spec, daemon_mount["name"])["hostPath"]["path"]
        # attach returns the table's path as the daemon sees it: the engine must see it there too.
        engine_mount = _mount_for(engine, path)
        assert engine_mount["mountPath"] == daemon_mount["mountPath"], what
        engine_volume = _volume(engine_spec, engine_mount["name"])
        assert engine_volume.get("hostPath", {}).get("path") == node_path, \
            f"the engine's {what} is not the node's {node_path}"
    assert _mount_for(engine, _shm_dir()).get("readOnly") is True, "ranks map the table read-only"
    assert not engine_spec.get("hostIPC")


def test_engine_env_names_the_daemons_endpoint():
    _, engine = _engine()
    assert _environment(engine)["ENGRAMD_SOCKET"] == "ipc://" + _socket_path()


def test_memory_limits_cover_memory_backed_volumes():
    """A memory-backed emptyDir's pages count against the memory of the containers writing it."""
    checked = 0
    for name, doc in DOCS:
        if doc["kind"] not in ("Pod", "DaemonSet", "Deployment", "StatefulSet"):
            continue
        spec = _pod_spec(doc)
        for volume in spec.get("volumes", []):
            empty = volume.get("emptyDir")
            if not empty or empty.get("medium") != "Memory":
                continue
            assert "sizeLimit" in empty, f"{name}: memory-backed emptyDir {volume['name']} has no sizeLimit"
            for container in spec.get("containers", []) + spec.get("initContainers", []):
                if any(m["name"] == volume["name"] for m in container.get("volumeMounts", [])):
                    limit = container.get("resources", {}).get("limits", {}).get("memory")
                    assert limit is not None and quantity(limit) >= quantity(empty["sizeLimit"]), \
                        f"{name}: {container['name']}'s memory limit {limit} < {volume['name']}'s {empty['sizeLimit']}"
                    checked += 1
    assert checked, "the engine example's /dev/shm emptyDir should have been checked"


def test_daemon_resources_account_for_the_table_on_huge_pages():
    """The table is on the node's hugetlbfs by default: its pages are charged to the daemon's
    hugepages-2Mi, which must hold two generations (a reload writes g+1 beside g), requests equal
    to limits as Kubernetes wants for huge pages."""
    ds, spec, container = _daemon()
    reservation = quantity(ds["spec"]["template"]["metadata"]["annotations"][RESERVATION_ANNOTATION])
    v41 = TableHeader.plan([LayerLayout(layer, 256, (rows,)) for layer, rows in zip((1, 14), V41_ROWS)],
                           "fingerprint", "/models/DeepSeek-V4.1", 1).total_bytes
    assert reservation >= v41, f"{RESERVATION_ANNOTATION} {reservation} is below V4.1's {v41}-byte table"
    volume = _volume(spec, _mount_for(container, _shm_dir())["name"])
    assert _is_under(volume["hostPath"]["path"], "/dev/hugepages"), "the table's directory is not the node's hugetlbfs"
    resources = container["resources"]
    assert resources["requests"]["hugepages-2Mi"] == resources["limits"]["hugepages-2Mi"]
    assert quantity(resources["limits"]["hugepages-2Mi"]) >= 2 * reservation
    assert quantity(resources["limits"]["memory"]) >= quantity(resources["requests"]["memory"])


def test_no_image_floats_on_latest():
    images = []
    for name, doc in DOCS:
        if doc["kind"] in ("Pod", "DaemonSet", "Deployment", "StatefulSet"):
            spec = _pod_spec(doc)
            images += [(name, c["image"]) for c in spec.get("containers", []) + spec.get("initContainers", [])]
    assert images
    for name, image in images:
        if "@sha256:" in image:
            continue
        last = image.rsplit("/", 1)[-1]
        assert ":" in last, f"{name}: image {image} has no tag (it means latest)"
        assert last.rsplit(":", 1)[1] != "latest", f"{name}: image {image} is tagged latest"


def _unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    section = None
    with open(UNIT) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("["):
                section = line.strip("[]")
                continue
            key, _, value = line.partition("=")
            settings.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return settings


def test_systemd_unit_waits_for_readiness_and_keeps_its_runtime_dir():
    settings = _unit_settings()
    assert settings["Service.Type"] == ["notify"]
    assert settings["Service.LimitMEMLOCK"] == ["infinity"]
    assert settings["Service.RuntimeDirectory"] == ["engramd"]
    (exec_start,) = settings["Service.ExecStart"]
    endpoint = _option(shlex.split(exec_start), "--socket")
    assert endpoint is not None and _is_under(endpoint[len("ipc://"):], "/run/engramd"), \
        f"the socket {endpoint} is not in the unit's RuntimeDirectory /run/engramd"


def test_systemd_puts_the_table_on_a_huge_always_tmpfs_sized_for_two_generations():
    mount = {}
    with open(os.path.join(DEPLOY, "systemd", "dev-shm-engramd.mount")) as f:
        for line in f:
            if "=" in line and not line.lstrip().startswith("#"):
                key, _, value = line.strip().partition("=")
                mount[key] = value
    settings = _unit_settings()
    (exec_start,) = settings["Service.ExecStart"]
    assert _option(shlex.split(exec_start), "--shm-dir") == mount["Where"]
    assert mount["Where"] in settings["Unit.RequiresMountsFor"][0].split()
    options = dict(option.partition("=")[::2] for option in mount["Options"].split(","))
    assert mount["Type"] == "tmpfs" and options["huge"] == "always"
    v41 = TableHeader.plan([LayerLayout(layer, 256, (rows,)) for layer, rows in zip((1, 14), V41_ROWS)],
                           "fingerprint", "/models/DeepSeek-V4.1", 1).total_bytes
    assert quantity(options["size"].replace("G", "Gi")) >= 2 * v41, "a reload needs two generations"


def test_numa_replicas_are_explained_where_the_operator_turns_them_on():
    """The unit and the DaemonSet say when to turn --numa-replicas on and what it costs, in the
    spelling the daemon accepts (its option and its environment variable)."""
    from engramd.cli.settings import SETTINGS

    setting = next(s for s in SETTINGS if s.name == "numa_replicas")
    with open(UNIT) as f:
        unit = f.read()
    with open(os.path.join(DEPLOY, "kubernetes", "engramd-daemonset.yaml")) as f:
        daemonset = f.read()
    assert f"{setting.envvar}=all" in unit and "--numa-replicas all" in unit
    assert "--numa-replicas all" in daemonset
    for text in (unit, daemonset):
        assert "socket link" in text and "once per node" in text
