"""The dashboard, the alerting rules and the scrape configs, read as files (deploy/observability/,
deploy/kubernetes/).  What the daemon exports, and what a real Prometheus makes of them, is
tests/integration/test_prometheus.py's business."""
from __future__ import annotations

import json
import os
import re
import sys

import pytest

from promql_names import selectors, split_comparison

yaml = pytest.importorskip("yaml")

DEPLOY = os.path.join(os.path.dirname(__file__), "..", "..", "deploy")
OBSERVABILITY = os.path.join(DEPLOY, "observability")
K8S = os.path.join(DEPLOY, "kubernetes")
sys.path.insert(0, OBSERVABILITY)

import build  # noqa: E402  (deploy/observability/build.py: writes the derived files)


def load(*parts: str):
    with open(os.path.join(DEPLOY, *parts)) as f:
        return json.load(f) if parts[-1].endswith(".json") else yaml.safe_load(f)


DASHBOARD = load("observability", "grafana-engramd.json")
RULES = load("observability", "engramd-rules.yaml")
PANELS = [panel for panel in DASHBOARD["panels"] if panel["type"] != "row"]
ALERTS = [rule for group in RULES["groups"] for rule in group["rules"] if "alert" in rule]


def test_the_derived_files_are_what_build_writes():
    assert build.stale() == [], "run python3 deploy/observability/build.py"


def test_the_prometheus_rule_holds_the_rules_file():
    rule = load("kubernetes", "engramd-prometheusrule.yaml")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["spec"] == RULES


def test_every_panel_reads_the_datasource_variable_and_has_a_unit_and_a_description():
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert PANELS
    for panel in PANELS:
        where = f"panel {panel['title']!r}"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{where} has no unit"
        assert len(panel.get("description", "")) > 80, f"{where} does not say what a bad value means"
        assert panel["targets"], f"{where} queries nothing"
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"] and target["expr"].strip(), where


def test_the_dashboard_is_templated_by_node():
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    for name in ("job", "instance"):
        assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert variables[name]["query"].startswith("label_values(engramd_state")
    assert variables["instance"]["multi"] and variables["instance"]["includeAll"]
    # Every series a panel reads is narrowed to the chosen job and nodes (regex matchers: All and
    # multiple nodes render as a|b).
    for panel in PANELS:
        for target in panel["targets"]:
            for name, matchers in selectors(target["expr"]):
                assert matchers.get("job") == ("=~", "$job"), f"{panel['title']}: {name} ignores $job"
                assert matchers.get("instance") == ("=~", "$instance"), f"{panel['title']}: {name} ignores $instance"


def test_panels_sit_in_rows_side_by_side_without_overlapping():
    taken: set[tuple[int, int]] = set()
    ids = [panel["id"] for panel in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    assert DASHBOARD["panels"][0]["type"] == "row"
    for panel in DASHBOARD["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                 for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not cells & taken, f"panel {panel['title']!r} overlaps another"
        taken |= cells


def test_every_alert_compares_a_signal_with_a_threshold_and_says_what_to_do():
    assert ALERTS
    names = [rule["alert"] for rule in ALERTS]
    assert len(names) == len(set(names))
    for rule in ALERTS:
        split_comparison(rule["expr"])  # raises unless it is `<signal> <op> <number>`
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], rule["alert"]
        assert len(annotations["runbook"]) > 100, f"{rule['alert']}: a runbook says what to do"


def _daemon_pod() -> tuple[dict, dict]:
    with open(os.path.join(K8S, "engramd-daemonset.yaml")) as f:
        daemonset = next(doc for doc in yaml.safe_load_all(f) if doc and doc["kind"] == "DaemonSet")
    template = daemonset["spec"]["template"]
    return template["metadata"]["labels"], template["spec"]["containers"][0]


def test_the_pod_monitor_scrapes_the_daemons_metrics_port_as_job_engramd():
    monitor = load("kubernetes", "engramd-podmonitor.yaml")
    labels, container = _daemon_pod()
    assert monitor["kind"] == "PodMonitor" and monitor["metadata"]["namespace"] == "engramd"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert labels[monitor["spec"]["jobLabel"]] == "engramd", "EngramdDown selects up{job=\"engramd\"}"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    command = [str(part) for part in container["command"]]
    assert ports[endpoint["port"]] == int(command[command.index("--metrics-port") + 1])
    assert command[command.index("--metrics-address") + 1] == "0.0.0.0", "a scraper on another host must reach it"
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance"} in endpoint["relabelings"]


def test_the_plain_scrape_configs_name_the_job_engramd_and_load_the_rules():
    labels, _ = _daemon_pod()
    for name in ("prometheus-static.yaml", "prometheus-kubernetes.yaml"):
        config = load("observability", name)
        assert config["rule_files"] == ["engramd-rules.yaml"], name
        assert [job["job_name"] for job in config["scrape_configs"]] == ["engramd"], name
    (job,) = load("observability", "prometheus-kubernetes.yaml")["scrape_configs"]
    keep = {rule["source_labels"][0]: rule["regex"] for rule in job["relabel_configs"] if rule.get("action") == "keep"}
    assert re.fullmatch(keep["__meta_kubernetes_pod_label_app_kubernetes_io_name"], labels["app.kubernetes.io/name"])
    assert re.fullmatch(keep["__meta_kubernetes_pod_container_port_name"], "metrics")


def test_the_huge_page_alert_fires_where_the_daemon_warns():
    from engramd.shm import huge_pages

    (rule,) = [rule for rule in ALERTS if rule["alert"] == "EngramdHugePageCoverageLow"]
    _, op, threshold = split_comparison(rule["expr"])
    assert (op, threshold) == ("<", huge_pages.WARN_COVERAGE)
    assert re.search(rf"engramd_table_bytes >= {huge_pages.WARN_BYTES}\)", rule["expr"]), rule["expr"]


def test_the_kubernetes_readme_lists_every_alert_with_its_duration():
    with open(os.path.join(K8S, "README.md")) as f:
        table = dict(re.findall(r"^\| `(Engramd\w+)` \| [^|]+ \| ([^|]+) \|$", f.read(), re.M))
    assert table == {rule["alert"]: rule.get("for", "-") for rule in ALERTS}
