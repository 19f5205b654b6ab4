"""grafanalib building blocks shared by the dashboards: the data source, variables, panels and annotations.

grafanalib 0.7.1 builds the dashboard, its variables and the time series, stat, table and state timeline
panels. Its Heatmap, GaugePanel and BarGauge emit Grafana 6-era options (`cards`, `fieldOptions`, thresholds
as strings) that current Grafana would have to migrate, so the two used here (`Heatmap`, `BarGauge`) are
small grafanalib `Panel` subclasses emitting the current options instead (grafanalib's own extension pattern).
"""

from __future__ import annotations

from typing import Any

import attr
from grafanalib import core as g

DATASOURCE = "${datasource}"
# The provisioned data source (provisioning/datasources/gpumond.yaml): the `datasource` variable starts on it.
# Its own name, not Grafana's default, so it never clashes with an existing "Prometheus" data source.
DATASOURCE_UID = "gpumond-prometheus"
DATASOURCE_NAME = "gpumond Prometheus"
PROMETHEUS = {"type": "prometheus", "uid": DATASOURCE}
# Reasons that say the clocks are low for a benign cause; the dashboards show the other ones.
BENIGN_REASONS = "gpu_idle|applications_clocks_setting|display_clock_setting"


def target(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False, table: bool = False) -> g.Target:
    """A PromQL query of a panel."""
    return g.Target(expr=expr, legendFormat=legend, refId=ref, instant=instant,
                    format="table" if table else "time_series")


def pos(x: int, y: int, w: int, h: int) -> g.GridPos:
    return g.GridPos(h=h, w=w, x=x, y=y)


def steps(*pairs: tuple[float | None, str]) -> list[dict[str, Any]]:
    """Threshold steps; the first value is None (Grafana's -Infinity)."""
    return [{"value": v, "color": c} for v, c in pairs]


def datasource_variable() -> g.Template:
    """The data source picker, starting on gpumond's provisioned one (any Prometheus data source can be picked)."""
    variable = g.Template(name="datasource", label="Data source", type="datasource", query="prometheus",
                          default=DATASOURCE_UID)
    variable._current = {"selected": True, "text": DATASOURCE_NAME, "value": DATASOURCE_UID}  # name, not uid
    return variable


def query_variable(name: str, query: str, *, label: str, multi: bool = True, all_value: str | None = None,
                   hide: int = 0) -> g.Template:
    """A Prometheus `label_values(...)` variable; multi-value ones default to All. `all_value=".*"` (for
    `cluster`) makes All also match series without the label, e.g. a Prometheus with no `cluster` target label."""
    return g.Template(name=name, label=label, query=query, dataSource=DATASOURCE, includeAll=multi, multi=multi,
                      allValue=all_value, refresh=2, sort=3 if name == "gpu" else 1, hide=hide)


def constant_variable(name: str, value: str) -> g.Template:
    """A hidden constant, e.g. the runbook base URL an operator may point at their own copy."""
    return g.Template(name=name, label=name, type="constant", query=value, hide=2, default=value)


def prometheus_annotation(name: str, expr: str, title: str, colour: str, text: str = "") -> dict[str, Any]:
    """An annotation from a PromQL query: the query in `target` (what Grafana's Prometheus data source migrates
    the older top-level `expr` / `step` into), the Prometheus-specific formatting next to it."""
    return {"name": name, "datasource": PROMETHEUS, "enable": True, "iconColor": colour,
            "target": {"expr": expr, "refId": "Anno", "interval": "30s"},
            "titleFormat": title, "textFormat": text, "useValueForTime": False}


@attr.s
class Heatmap(g.Panel):
    """The current heatmap panel, bucketing the values of many series at each time (calculate: true)."""

    unit = attr.ib(default="")
    scheme = attr.ib(default="Oranges")

    def to_json_data(self) -> dict[str, Any]:
        return self.panel_json({
            "type": "heatmap",
            "fieldConfig": {"defaults": {"unit": self.unit}, "overrides": []},
            "options": {"calculate": True, "calculation": {"yBuckets": {"mode": "count", "value": "12"}},
                        "color": {"mode": "scheme", "scheme": self.scheme, "exponent": 0.5, "steps": 64,
                                  "fill": "dark-orange", "reverse": False},
                        "cellGap": 1, "yAxis": {"unit": self.unit, "axisPlacement": "left"},
                        "legend": {"show": True}, "tooltip": {"mode": "single", "yHistogram": True},
                        "rowsFrame": {"layout": "auto"}, "showValue": "never",
                        "filterValues": {"le": 1e-9}, "cellValues": {"unit": self.unit}},
        })


@attr.s
class BarGauge(g.Panel):
    """The current bar gauge panel: one bar per series, last value."""

    unit = attr.ib(default="")
    min = attr.ib(default=None)
    max = attr.ib(default=None)

    def to_json_data(self) -> dict[str, Any]:
        defaults: dict[str, Any] = {"unit": self.unit, "color": {"mode": "thresholds"},
                                    "thresholds": {"mode": "absolute", "steps": self.thresholds}}
        if self.min is not None:
            defaults["min"] = self.min
        if self.max is not None:
            defaults["max"] = self.max
        return self.panel_json({
            "type": "bargauge",
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"displayMode": "gradient", "orientation": "horizontal", "showUnfilled": True,
                        "valueMode": "color", "namePlacement": "auto", "sizing": "auto", "minVizHeight": 16,
                        "maxVizHeight": 300, "minVizWidth": 8,
                        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
        })


def runbook_links() -> list[dict[str, Any]]:
    """Data links for every cell of an alerts table row: the runbook of that row's alertname."""
    return [{"title": "Runbook: ${__data.fields.alertname}", "url": "${runbook_base}/${__data.fields.alertname}.md",
             "targetBlank": True}]


def hide_columns(*names: str) -> dict[str, Any]:
    """A transformation hiding table columns (Time, Value, __name__, …)."""
    return {"id": "organize", "options": {"excludeByName": {n: True for n in names}}}
