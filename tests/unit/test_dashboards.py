"""The committed dashboards: built from dashboards/*.py, valid against Grafana's published schema, current panels."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from dashboards import build

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "tests" / "schemas" / "grafana-dashboard.schema.json"
PROVISIONING = ROOT / "dashboards" / "provisioning"
FILES = sorted(build.OUT.glob("*.json"))
CURRENT_PANELS = {"timeseries", "stat", "gauge", "bargauge", "table", "state-timeline", "heatmap", "row"}


def schema() -> dict[str, Any]:
    """The vendored schema with its two documented gaps closed (tests/schemas/README.md)."""
    s = copy.deepcopy(json.loads(SCHEMA.read_text()))
    d = s["definitions"]
    # 1. Grafana stores the base threshold step (-Infinity) as null; Threshold.value's own description in the
    #    schema says so ("Nulls currently appear here when serializing -Infinity to JSON") but types it number.
    d["Threshold"]["properties"]["value"] = {"type": ["number", "null"]}
    # 2. AnnotationTarget describes only the built-in Grafana source ("TODO: this should be a regular
    #    DataQuery"). A Prometheus annotation's target is a PromQL query, with the Prometheus data source's
    #    formatting fields beside it — described here as strictly as the rest.
    d["AnnotationQuery"]["properties"]["target"] = {"anyOf": [
        {"$ref": "#/definitions/AnnotationTarget"},
        {"type": "object", "additionalProperties": False, "required": ["expr", "refId"],
         "properties": {"expr": {"type": "string", "minLength": 1}, "refId": {"type": "string"},
                        "interval": {"type": "string"}}}]}
    for field in ("titleFormat", "textFormat", "tagKeys"):
        d["AnnotationQuery"]["properties"][field] = {"type": "string"}
    d["AnnotationQuery"]["properties"]["useValueForTime"] = {"type": "boolean"}
    return s


def test_the_three_dashboards_are_committed() -> None:
    assert [f.name for f in FILES] == ["gpumond-fleet.json", "gpumond-job.json", "gpumond-node.json"]


@pytest.mark.parametrize("name", sorted(build.BUILDERS))
def test_committed_json_is_what_the_sources_build(name: str) -> None:
    path = build.OUT / f"gpumond-{name}.json"
    assert path.read_text(encoding="utf-8") == build.text(name), \
        f"{path} is stale: run `python -m dashboards.build` and commit the result"


@pytest.mark.parametrize("stale", ["provisioning", "chart"])
def test_build_check_fails_on_drift(stale: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stale JSON in the provisioning tree or in the Helm chart's copy fails --check; a build repairs both."""
    dirs = {"provisioning": tmp_path / "provisioning", "chart": tmp_path / "chart"}
    for d in dirs.values():
        d.mkdir()
        for f in FILES:
            (d / f.name).write_text(f.read_text())
    monkeypatch.setattr(build, "OUT", dirs["provisioning"])
    monkeypatch.setattr(build, "CHART_OUT", dirs["chart"])
    assert build.main(["--check"]) == 0
    (dirs[stale] / "gpumond-node.json").write_text("{}\n")
    assert build.main(["--check"]) == 1
    assert build.main([]) == 0 and build.main(["--check"]) == 0


def test_the_helm_chart_carries_the_committed_json() -> None:
    copies = sorted(build.CHART_OUT.glob("*.json"))
    assert [c.name for c in copies] == [f.name for f in FILES], "run `python -m dashboards.build` and commit"
    for f, c in zip(FILES, copies):
        assert c.read_bytes() == f.read_bytes(), f"{c} is stale: run `python -m dashboards.build` and commit"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_dashboard_validates_against_grafanas_published_schema(path: Path) -> None:
    errors = sorted(jsonschema.Draft7Validator(schema()).iter_errors(json.loads(path.read_text())),
                    key=lambda e: list(e.absolute_path))
    assert errors == [], "\n".join(f"{list(e.absolute_path)}: {e.message[:300]}" for e in errors[:20])


def test_the_schema_rejects_what_grafana_would_not_read() -> None:
    """The validator is not a rubber stamp: legacy panels and grafanalib's raw output fail it."""
    validator = jsonschema.Draft7Validator(schema())
    good = json.loads(FILES[0].read_text())
    legacy = copy.deepcopy(good)
    legacy["panels"][0]["span"] = 4
    assert not validator.is_valid(legacy)
    raw = build.json.loads(build.json.dumps(build.fleet.build().to_json_data(), cls=build.DashboardEncoder))
    assert not validator.is_valid(raw)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_only_current_panel_types_with_units_and_a_prometheus_query(path: Path) -> None:
    d = json.loads(path.read_text())
    assert d["schemaVersion"] >= 39 and d["uid"].startswith("gpumond-")
    ids = [p["id"] for p in d["panels"]]
    assert len(set(ids)) == len(ids)
    for p in d["panels"]:
        assert p["type"] in CURRENT_PANELS, f"{p['title']}: {p['type']} is not a current panel type"
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and all(t["expr"] for t in p["targets"]), p["title"]
        if p["type"] in ("timeseries", "bargauge", "heatmap"):
            assert p["fieldConfig"]["defaults"].get("unit"), f"{p['title']}: no unit"
    names = [v["name"] for v in d["templating"]["list"]]
    assert names[:2] == ["datasource", "cluster"], names


def test_variables_cover_datasource_cluster_node_gpu_and_job() -> None:
    names = {v["name"] for f in FILES for v in json.loads(f.read_text())["templating"]["list"]}
    assert {"datasource", "cluster", "node", "gpu", "job"} <= names


def test_provisioning_points_grafana_at_the_committed_json() -> None:
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "gpumond.yaml").read_text())["providers"][0]
    # After `cp -r dashboards/provisioning/. /etc/grafana/provisioning/`, the provider's path holds the JSON.
    installed = Path(provider["options"]["path"]).relative_to("/etc/grafana/provisioning")
    assert PROVISIONING / installed == build.OUT
    assert provider["type"] == "file"
    ds = yaml.safe_load((PROVISIONING / "datasources" / "gpumond.yaml").read_text())["datasources"]
    assert [d["type"] for d in ds] == ["prometheus"] and ds[0]["url"].startswith("http")


def test_the_provisioned_data_source_is_gpumonds_own_and_every_dashboard_starts_on_it() -> None:
    """Not named "Prometheus" nor made the default: it sits next to a Grafana's own data source."""
    (ds,) = yaml.safe_load((PROVISIONING / "datasources" / "gpumond.yaml").read_text())["datasources"]
    assert ds["name"] != "Prometheus" and "gpumond" in ds["name"] and ds["isDefault"] is False
    for f in FILES:
        (variable,) = [v for v in json.loads(f.read_text())["templating"]["list"] if v["type"] == "datasource"]
        assert variable["current"] == {"selected": True, "text": ds["name"], "value": ds["uid"]}, f.name


def test_the_model_pass_never_drops_an_unknown_option_silently() -> None:
    from dashboards import model

    with pytest.raises(ValueError, match=r"panel 'x': keys \['newOption'\]"):
        model.panel({"type": "timeseries", "title": "x", "targets": [], "newOption": 1})
    kept = model.panel({"type": "timeseries", "title": "x", "span": 4, "datasource": "${datasource}",
                        "targets": [{"expr": "up", "refId": "A", "step": 10, "instant": True}]})
    assert "span" not in kept and kept["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert kept["targets"] == [{"expr": "up", "refId": "A", "instant": True, "range": False}]
