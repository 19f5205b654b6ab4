"""Bring grafanalib 0.7.1's output to Grafana's current dashboard model (schemaVersion 39).

grafanalib writes a superset dating from Grafana 5: null for every unset option, `span`/`height`/`minSpan`
and other keys current Grafana no longer reads, data sources as bare strings, and per-target legacy fields.
This pass keeps exactly the keys of Grafana's published dashboard model (the grafana-foundation-sdk
dashboard schema the tests validate against), drops nulls, and turns data-source strings into references.
A key that is neither in the model nor in the known-legacy list stops the build, so no option set in the
dashboard sources is ever dropped silently.
"""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION = 39

DASHBOARD_KEYS = {"id", "uid", "title", "description", "revision", "gnetId", "tags", "timezone", "editable",
                  "graphTooltip", "time", "timepicker", "fiscalYearStartMonth", "liveNow", "weekStart", "refresh",
                  "schemaVersion", "version", "panels", "templating", "annotations", "links"}
DASHBOARD_LEGACY = {"__inputs", "hideControls", "rows", "sharedCrosshair", "style"}
PANEL_KEYS = {"type", "id", "pluginVersion", "tags", "targets", "title", "description", "transparent", "datasource",
              "gridPos", "links", "repeat", "repeatDirection", "maxPerRow", "maxDataPoints", "transformations",
              "interval", "timeFrom", "timeShift", "hideTimeOverride", "libraryPanel", "options", "fieldConfig"}
PANEL_LEGACY = {"cacheTimeout", "editable", "error", "height", "minSpan", "span",
                # table: grafanalib repeats at panel level what it also writes into fieldConfig / options
                "color", "columns", "fontSize", "mappings"}
VARIABLE_KEYS = {"type", "name", "label", "hide", "skipUrlSync", "description", "query", "datasource", "current",
                 "multi", "options", "refresh", "sort", "includeAll", "allValue", "regex"}
VARIABLE_LEGACY = {"useTags", "tagsQuery", "tagValuesQuery", "auto", "auto_min", "auto_count"}
TARGET_KEYS = {"expr", "legendFormat", "refId", "instant", "range", "format", "interval", "datasource"}
TARGET_LEGACY = {"query", "target", "metric", "step", "intervalFactor", "hide"}


def _prune(value: Any) -> Any:
    """Drop None values from dicts, recursively (grafanalib writes null for every unset option)."""
    if isinstance(value, dict):
        # A threshold step's null value is Grafana's -Infinity (the base step), not an unset option.
        step = "color" in value and "value" in value
        return {k: _prune(v) for k, v in value.items() if v is not None or (step and k == "value")}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def _keep(obj: dict[str, Any], allowed: set[str], legacy: set[str], where: str) -> dict[str, Any]:
    unknown = set(obj) - allowed - legacy
    if unknown:
        raise ValueError(f"{where}: keys {sorted(unknown)} are in neither Grafana's model nor the legacy list")
    return {k: v for k, v in obj.items() if k in allowed}


def _datasource(value: Any) -> Any:
    return {"type": "prometheus", "uid": value} if isinstance(value, str) else value


def _thresholds(fc: dict[str, Any]) -> None:
    defaults = fc.setdefault("defaults", {})
    fc.setdefault("overrides", [])
    th = defaults.get("thresholds")
    if th is not None and not th.get("steps"):
        del defaults["thresholds"]  # grafanalib's empty default: let Grafana use its own


def panel(p: dict[str, Any]) -> dict[str, Any]:
    """One panel in the current model."""
    where = f"panel {p.get('title')!r}"
    out = _keep(p, PANEL_KEYS, PANEL_LEGACY, where)
    out["datasource"] = _datasource(out.get("datasource"))
    targets = []
    for t in out.get("targets", []):
        t = _keep(t, TARGET_KEYS, TARGET_LEGACY, f"{where} target {t.get('refId')}")
        if t.get("format") == "time_series":
            del t["format"]  # the default
        if t.get("instant"):
            t["range"] = False
        else:
            t.pop("instant", None)
        if not t.get("interval"):
            t.pop("interval", None)
        t.pop("datasource", None)  # inherits the panel's
        targets.append(t)
    out["targets"] = targets
    for k in ("links", "transformations"):
        if not out.get(k):
            out.pop(k, None)
    if out.get("hideTimeOverride") is False:
        del out["hideTimeOverride"]
    if out.get("transparent") is False:
        del out["transparent"]
    out.pop("maxDataPoints", None)  # grafanalib's 100 would coarsen every panel; Grafana picks by width
    if "fieldConfig" in out:
        _thresholds(out["fieldConfig"])
    if isinstance(out.get("options"), list):  # grafanalib writes [] for panels without options
        out["options"] = {}
    return out


def variable(v: dict[str, Any]) -> dict[str, Any]:
    """One template variable in the current model."""
    out = _keep(v, VARIABLE_KEYS, VARIABLE_LEGACY, f"variable {v.get('name')!r}")
    out["datasource"] = _datasource(out.get("datasource"))
    if out.get("includeAll"):
        out["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
    elif out.get("type") == "datasource" and out.get("current"):
        out["current"] = {k: out["current"][k] for k in ("selected", "text", "value")}  # the panels' data source
    elif out.get("type") == "constant":
        out["current"] = {"selected": False, "text": out["query"], "value": out["query"]}
        out.pop("datasource", None)
    else:
        out.pop("current", None)  # Grafana selects the first option
    if not out.get("options"):
        out.pop("options", None)
    if out.get("type") == "datasource":
        out.pop("datasource", None)
    return _prune(out)


def dashboard(d: dict[str, Any]) -> dict[str, Any]:
    """The whole dashboard in the current model."""
    out = _keep(_prune(d), DASHBOARD_KEYS, DASHBOARD_LEGACY, f"dashboard {d.get('title')!r}")
    out["schemaVersion"] = SCHEMA_VERSION
    out["panels"] = [panel(p) for p in out.get("panels", [])]
    out["templating"] = {"list": [variable(v) for v in out.get("templating", {}).get("list", [])]}
    tp = out.get("timepicker")
    if tp is not None:
        out["timepicker"] = {k: tp[k] for k in ("hidden", "refresh_intervals", "time_options") if k in tp}
    out.pop("id", None)  # Grafana assigns it on import / provisioning
    return out
