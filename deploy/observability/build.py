"""Write the files derived from this directory's sources; `--check` says whether they are up to date.

    panels.py + grafana.py  ->  grafana-engramd.json                       (the dashboard)
    engramd-rules.yaml      ->  ../kubernetes/engramd-prometheusrule.yaml  (the same rules, for the
                                                                            Prometheus Operator)

The PrometheusRule embeds the rules file's text under `spec:` line for line (comments too), so
the two can never say different things; tests/unit/test_observability_files.py fails when a
written file is not what this script writes now.  Standard library only.
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from grafana import dashboard  # noqa: E402  (beside this file, not a package)

DASHBOARD = os.path.join(HERE, "grafana-engramd.json")
RULES = os.path.join(HERE, "engramd-rules.yaml")
PROMETHEUS_RULE = os.path.join(HERE, "..", "kubernetes", "engramd-prometheusrule.yaml")

PROMETHEUS_RULE_HEAD = """\
# engramd's alerting rules for the Prometheus Operator: deploy/observability/engramd-rules.yaml
# under spec:, written by `python3 deploy/observability/build.py` (edit that file, not this one).
#   kubectl apply -f engramd-prometheusrule.yaml
# A Prometheus resource loads PrometheusRules that its ruleSelector matches: add the labels yours
# selects on (kube-prometheus-stack's Helm chart selects release: <its release name>).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: engramd
  namespace: engramd
  labels:
    app.kubernetes.io/name: engramd
spec:
"""


def rendered() -> dict[str, str]:
    """Each derived file's path and the text it should hold."""
    with open(RULES) as f:
        rules = f.read()
    body = "".join(f"  {line}" if line.strip() else line for line in rules.splitlines(keepends=True))
    return {DASHBOARD: json.dumps(dashboard(), indent=2) + "\n", os.path.normpath(PROMETHEUS_RULE):
            PROMETHEUS_RULE_HEAD + body}


def stale() -> list[str]:
    """The derived files whose text is not what this script writes now."""
    out = []
    for path, text in rendered().items():
        try:
            with open(path) as f:
                same = f.read() == text
        except FileNotFoundError:
            same = False
        if not same:
            out.append(path)
    return out


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        paths = stale()
        for path in paths:
            print(f"{path} is out of date: run python3 {os.path.relpath(__file__)}", file=sys.stderr)
        return 1 if paths else 0
    if argv:
        print("usage: build.py [--check]", file=sys.stderr)
        return 2
    for path, text in rendered().items():
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
