"""The dashboard and the alerting rules against a real Prometheus scraping real daemons.

Debian's prometheus (tests/support/prometheus_tools.py installs it or the tests skip) scrapes, twice a
second, two real daemons through the shipped Kubernetes scrape job (its relabelling as it is;
file_sd stands in for Kubernetes' pod discovery, which Debian's build leaves out, handing
Prometheus the labels that discovery would): daemon A serves the demo table to two real client
processes looking rows up on device="cpu" (on A's gather budget); daemon B's load failed.  Every
query of the dashboard and the signal of every alert are then evaluated through the HTTP API,
each returning data for the live daemon A (the HBM cache's figures too: a client with the cache
off reports zeros).  The rules Prometheus evaluates are the
shipped file's with every `for:` shortened to 1 s (a copy written here; the expressions are the
shipped ones), so that alerts that must fire do within seconds: LoadFailed for B, ReloadFailed
for A after a reload of a broken checkpoint, Down for A once it is stopped; and none fires for A
while it is healthy.  The alerts no daemon here can bring about: test_prometheus_rule_cases.py.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import urllib.parse
import urllib.request

import pytest
from waiting import end_process, free_port, wait_for

from promql_names import selectors, split_comparison
from prometheus_tools import prometheus_binaries  # noqa: F401  (a fixture)

yaml = pytest.importorskip("yaml")

OBSERVABILITY = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "observability")
SCRAPE = "500ms"  # scrape and rule evaluation: short, so that the test waits little for either
RATE_WINDOW = "5s"  # what $__rate_interval stands for at that scrape: ten samples
CLIENT = textwrap.dedent("""
    import os, sys, time
    import torch
    from engram_client import EngramClient
    endpoint, rank, stop_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    deadline = time.monotonic() + 120  # bounded whatever happens to the test
    with EngramClient(endpoint=endpoint, device="cpu", rank=rank, timeout=30) as client:
        table = client.table(client.layers[0])
        print("attached", flush=True)
        while not os.path.exists(stop_file) and time.monotonic() < deadline:
            table.lookup(torch.randint(0, table.num_rows, (64,)))
            time.sleep(0.05)
""")


def shipped(name: str):
    with open(os.path.join(OBSERVABILITY, name)) as f:
        return json.load(f) if name.endswith(".json") else yaml.safe_load(f)


def test_promtool_accepts_the_rules_and_the_static_scrape_config(prometheus_binaries):
    _, promtool = prometheus_binaries
    for command in (["check", "rules", "engramd-rules.yaml"], ["check", "config", "prometheus-static.yaml"]):
        result = subprocess.run([promtool, *command], cwd=OBSERVABILITY, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"promtool {' '.join(command)}:\n{result.stdout}{result.stderr}"


def test_promtool_accepts_the_kubernetes_scrape_config_but_for_its_discovery(prometheus_binaries, tmp_path):
    """The file's comment says which promtool checks it whole: one with Kubernetes discovery, which
    Debian's lacks.  Debian's refuses exactly that field; with the discovery swapped for a file of
    targets, it accepts the rest (relabelling, rule files) as shipped."""
    _, promtool = prometheus_binaries
    name = "prometheus-kubernetes.yaml"
    with open(os.path.join(OBSERVABILITY, name)) as f:
        assert "needs a promtool with Kubernetes service discovery" in f.read()
    whole = subprocess.run([promtool, "check", "config", name], cwd=OBSERVABILITY, capture_output=True, text=True,
                           timeout=60)
    if whole.returncode != 0:  # a promtool without Kubernetes discovery: that must be its only complaint
        complaints = [line for line in (whole.stdout + whole.stderr).splitlines() if "not found in type" in line]
        assert complaints and all("field kubernetes_sd_configs not found" in line for line in complaints), \
            whole.stdout + whole.stderr
    config = shipped(name)
    config["rule_files"] = [os.path.join(OBSERVABILITY, path) for path in config["rule_files"]]
    (job,) = config["scrape_configs"]
    del job["kubernetes_sd_configs"]
    job["file_sd_configs"] = [{"files": [str(tmp_path / "targets.json")]}]
    (tmp_path / "prometheus.yaml").write_text(yaml.safe_dump(config))
    rest = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yaml")], capture_output=True,
                          text=True, timeout=60)
    assert rest.returncode == 0, rest.stdout + rest.stderr


class Prometheus:
    def __init__(self, binary: str, directory, targets: list[dict]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        rules = shipped("engramd-rules.yaml")
        for group in rules["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = "1s"  # the shipped durations are minutes; the expressions stay as shipped
        (directory / "rules.yaml").write_text(yaml.safe_dump(rules))
        (directory / "targets.json").write_text(json.dumps(targets))
        config = shipped("prometheus-kubernetes.yaml")
        config["global"] = {"scrape_interval": SCRAPE, "scrape_timeout": SCRAPE, "evaluation_interval": SCRAPE}
        config["rule_files"] = [str(directory / "rules.yaml")]
        (job,) = config["scrape_configs"]
        del job["kubernetes_sd_configs"]
        job["file_sd_configs"] = [{"files": [str(directory / "targets.json")]}]
        (directory / "prometheus.yaml").write_text(yaml.safe_dump(config))
        self.log = open(directory / "prometheus.log", "wb")
        self.proc = subprocess.Popen([binary, f"--config.file={directory / 'prometheus.yaml'}",
                                      f"--storage.tsdb.path={directory / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.log_path = directory / "prometheus.log"
        try:
            wait_for(self._ready, "Prometheus to be ready", timeout=60)
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def api(self, path: str, **params: str):
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
        assert body["status"] == "success", f"{path} {params}: {body.get('error')}"
        return body["data"]

    def query(self, expr: str) -> dict[str, float]:
        """An instant query's series, by instance."""
        return {s["metric"].get("instance", ""): float(s["value"][1]) for s in self.api("query", query=expr)["result"]}

    def alerts(self, instance: str) -> dict[str, str]:
        """The alerts pending or firing for ``instance``: name -> state."""
        return {a["labels"]["alertname"]: a["state"] for a in self.api("alerts")["alerts"]
                if a["labels"].get("instance") == instance}

    def stop(self) -> None:
        end_process(self.proc)
        self.log.close()


def pod(port: int, node: str, port_name: str = "metrics") -> dict:
    """A target as Kubernetes' pod discovery describes a DaemonSet pod's port."""
    return {"targets": [f"127.0.0.1:{port}"], "labels": {
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": "engramd", "__meta_kubernetes_pod_node_name": node,
        "__meta_kubernetes_pod_container_port_name": port_name, "__meta_kubernetes_pod_name": f"engramd-{node}"}}


def exported_names(port: int) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def for_node(expr: str, node: str) -> str:
    return (expr.replace("$__rate_interval", RATE_WINDOW).replace("$job", "engramd")
            .replace("$instance", node))


def test_dashboard_and_rules_against_live_daemons(prometheus_binaries, daemon_factory, tmp_path):
    prometheus_binary, _ = prometheus_binaries
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    port_a, port_b = free_port(), free_port()
    a = daemon_factory("--metrics-port", str(port_a), "--reload-root", str(tmp_path), name="a")
    b = daemon_factory("--metrics-port", str(port_b), "--checkpoint", str(broken), name="b")
    a.wait_state("ready")
    b.wait_state("failed")
    # A decoy on another container port: the shipped relabelling must drop it.
    prometheus = Prometheus(prometheus_binary, tmp_path,
                            [pod(port_a, "node-a"), pod(port_b, "node-b"), pod(port_a, "node-c", "other")])
    stop_file = tmp_path / "stop-clients"
    clients = []
    try:
        clients += [subprocess.Popen([sys.executable, "-c", CLIENT, a.endpoint, str(rank), str(stop_file)],
                                     stdout=subprocess.PIPE, text=True) for rank in (0, 1)]
        # Two refusals, the second after Prometheus saw the first (a labelled counter that first
        # appears at 1 shows no increase): the rule sees a refusal, too few for an alert.
        refused = 'engramd_request_errors_total{instance="node-a",op="detach",code="unknown_client"}'
        for count in (1, 2):
            with pytest.raises(Exception, match="no lease"):
                a.connection.request("detach", {"client_id": "ghost"})
            wait_for(lambda: prometheus.query(f"{refused} == {count}"), f"Prometheus to see refusal {count}")
        for client in clients:
            assert client.stdout.readline().strip() == "attached", "a client did not attach"
        a.connection.request("reload")
        wait_for(lambda: a.status()["generation"] == 2, "A's reload to be served")
        wait_for(lambda: prometheus.query('count_over_time(engramd_clients{instance="node-a"}[1m]) >= 12 and '
                                          'engramd_clients{instance="node-a"} == 2 and '
                                          'engramd_generation{instance="node-a"} == 2'),
                 "a dozen scrapes of A, the last with both clients and generation 2", timeout=90)
        # The gather budget's panels read what each client's heartbeats report (every third of
        # --lease-seconds): both clients' rows must have moved within the dashboard's rate window.
        wait_for(lambda: prometheus.query(f'count(rate(engramd_client_gather_rows{{instance="node-a"}}[{RATE_WINDOW}]) '
                                          f'> 0) == 2'),
                 "both clients' rows gathered on A's budget to rise between scrapes", timeout=60)

        assert set(prometheus.api("label/instance/values", **{"match[]": "engramd_state"})) == {"node-a", "node-b"}
        assert prometheus.api("label/job/values", **{"match[]": "engramd_state"}) == ["engramd"]
        exported = exported_names(port_a) | {"up"}  # up: Prometheus's own, per target
        known = exported

        dashboard = shipped("grafana-engramd.json")
        for panel in (p for p in dashboard["panels"] if p["type"] != "row"):
            for target in panel["targets"]:
                names = {name for name, _ in selectors(target["expr"])}
                assert names <= known, f"{panel['title']} reads {names - known}, which engramd does not export"
                values = prometheus.query(for_node(target["expr"], "node-a"))
                assert set(values) == {"node-a"}, f"{panel['title']}: {target['expr']} returned {values}"
                assert all(math.isfinite(v) for v in values.values()), f"{panel['title']}: {values}"
        state = next(p for p in dashboard["panels"] if p["title"] == "State")["targets"][0]["expr"]
        assert prometheus.query(for_node(state, "node-a|node-b")) == {"node-a": 0, "node-b": 3}  # ready, failed

        alerts = [rule for group in shipped("engramd-rules.yaml")["groups"] for rule in group["rules"]]
        for rule in alerts:
            names = {name for name, _ in selectors(rule["expr"])}
            assert names <= known, f"{rule['alert']} reads {names - known}, which engramd does not export"
            signal, _, _ = split_comparison(rule["expr"])
            values = prometheus.query(signal)
            assert "node-a" in values and math.isfinite(values["node-a"]), f"{rule['alert']}: {signal} -> {values}"
            if rule["alert"] == "EngramdPeerRefusedRepeatedly":
                assert values["node-a"] > 0, "the rule does not see the second refusal"

        wait_for(lambda: prometheus.alerts("node-b").get("EngramdLoadFailed") == "firing",
                 "EngramdLoadFailed to fire for B", timeout=30)
        # A's rules ran as often as B's, and a `for:` of 1 s makes any true condition at least pending.
        assert prometheus.alerts("node-a") == {}, "an alert is pending or firing for a healthy daemon"
        assert prometheus.alerts("node-c") == {}

        a.connection.request("reload", {"checkpoint": str(broken)})
        wait_for(lambda: prometheus.alerts("node-a").get("EngramdReloadFailed") == "firing",
                 "EngramdReloadFailed to fire for A", timeout=30)
        assert a.status()["state"] == "ready" and "EngramdLoadFailed" not in prometheus.alerts("node-a")

        stop_file.touch()
        for client in clients:
            assert client.wait(timeout=60) == 0
        a.stop()
        wait_for(lambda: prometheus.alerts("node-a").get("EngramdDown") == "firing", "EngramdDown to fire for A",
                 timeout=30)
        assert prometheus.query(for_node(state, "node-a")) == {"node-a": 4}  # down
    finally:
        stop_file.touch()
        for client in clients:
            try:
                client.wait(timeout=30)
            except subprocess.TimeoutExpired:
                client.kill()
                client.wait(timeout=10)
            client.stdout.close()
        prometheus.stop()
