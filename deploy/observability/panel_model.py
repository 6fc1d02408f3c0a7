"""The vocabulary the dashboard's panels are written in: a Row of Panels, each of Queries.

panels.py, budget_panels.py and cache_panels.py say what each row shows; grafana.py turns
these into Grafana's JSON.  Every query filters on the dashboard's $job and $instance
variables through sel(), so one dashboard covers a fleet.
"""
from __future__ import annotations

from dataclasses import dataclass, field

RATE = "$__rate_interval"


def sel(metric: str, **matchers: str) -> str:
    """``metric`` filtered to the dashboard's job and nodes, and to ``matchers`` (label="value")."""
    extra = "".join(f',{label}="{value}"' for label, value in matchers.items())
    return f'{metric}{{job=~"$job",instance=~"$instance"{extra}}}'


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = "{{instance}}"


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str  # a Grafana unit id: none, short, bytes, Bps, percentunit, reqps, opm
    description: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"  # or state-timeline
    states: tuple[tuple[int, str, str], ...] = ()  # state-timeline: (value, text, colour)
    max: float | None = None
    no_value: str | None = None  # what a panel with no series shows (a counter no event has created yet)


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)
