"""Grafana's JSON model of the engramd dashboard, built from panels.py (and the rows it gathers).

Owns what every panel has in common: the data source (the $datasource variable, so the
dashboard imports into any Grafana without editing), the $job and $instance variables, the
grid layout (full-width rows, panels side by side) and ids.  What each panel shows lives
in panels.py.  Schema 39 is Grafana 10.4 and 11's; older and newer Grafanas migrate it on import.
"""
from __future__ import annotations

from typing import Any

from panel_model import Panel, Row
from panels import ROWS

UID = "engramd"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PANEL_HEIGHT = 8
GRID_WIDTH = 24


def _variables() -> list[dict[str, Any]]:
    def query(name: str, label: str, expr: str, multi: bool) -> dict[str, Any]:
        return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE, "query": expr, "refresh": 2, "sort": 1, "multi": multi, "includeAll": multi,
                "options": [], "hide": 0, "regex": ""}

    return [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "options": [], "hide": 0, "refresh": 1, "regex": ""},
        query("job", "Job", "label_values(engramd_state, job)", multi=False),
        query("instance", "Node", 'label_values(engramd_state{job=~"$job"}, instance)', multi=True),
    ]


def _field_config(panel: Panel) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit, "min": 0}
    if panel.max is not None:
        defaults["max"] = panel.max
    if panel.no_value is not None:
        defaults["noValue"] = panel.no_value
    if panel.kind == "state-timeline":
        defaults["color"] = {"mode": "thresholds"}
        defaults["thresholds"] = {"mode": "absolute", "steps": [{"color": "text", "value": None}]}
        defaults["mappings"] = [{"type": "value", "options": {
            str(value): {"text": text, "color": colour, "index": index}
            for index, (value, text, colour) in enumerate(panel.states)}}]
    else:
        defaults["color"] = {"mode": "palette-classic"}
        defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
                              "spanNulls": False}
    return {"defaults": defaults, "overrides": []}


def _options(panel: Panel) -> dict[str, Any]:
    legend = {"displayMode": "list", "placement": "bottom", "showLegend": True, "calcs": []}
    if panel.kind == "state-timeline":
        return {"showValue": "never", "mergeValues": True, "rowHeight": 0.9, "alignValue": "left",
                "legend": legend, "tooltip": {"mode": "single", "sort": "none"}}
    return {"legend": legend, "tooltip": {"mode": "multi", "sort": "desc"}}


def _panel(panel: Panel, panel_id: int, x: int, y: int, width: int) -> dict[str, Any]:
    return {
        "id": panel_id, "type": panel.kind, "title": panel.title, "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": PANEL_HEIGHT, "w": width, "x": x, "y": y},
        "fieldConfig": _field_config(panel), "options": _options(panel),
        "targets": [{"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": query.expr,
                     "legendFormat": query.legend, "range": True, "instant": False}
                    for i, query in enumerate(panel.queries)],
    }


def _row(row: Row, panel_id: int, y: int) -> dict[str, Any]:
    return {"id": panel_id, "type": "row", "title": row.title, "collapsed": False, "panels": [],
            "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y}}


def dashboard(rows: tuple[Row, ...] = ROWS) -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    for row in rows:
        panels.append(_row(row, len(panels) + 1, y))
        y += 1
        width = GRID_WIDTH // len(row.panels)
        for i, panel in enumerate(row.panels):
            panels.append(_panel(panel, len(panels) + 1, i * width, y, width))
        y += PANEL_HEIGHT
    return {
        "uid": UID, "title": "engramd",
        "description": "engramd on every node: state, loads, clients and leases, requests and refusals, "
                       "re-adoptions and reloads (deploy/observability/ in the engramd repository).",
        "tags": ["engramd"], "editable": True, "graphTooltip": 1, "timezone": "", "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"}, "timepicker": {}, "links": [],
        "schemaVersion": 39, "version": 1,
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "templating": {"list": _variables()},
        "panels": panels,
    }
