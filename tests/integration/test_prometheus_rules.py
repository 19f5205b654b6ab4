"""deploy/prometheus: promtool checks and unit-tests the rules; every catalogue alert has a rule and tests.

- `promtool check rules` and `promtool test rules` (deploy/prometheus/tests/*.yml) pass;
- every alert of gpumond/alerts/catalogue.py has an alerting rule with its alertname, severity and
  annotations (summary with the catalogue's wording, description, runbook_url of its page), and no
  rule raises an alert the catalogue does not know;
- every alert has a promtool case where it fires (labels and annotations checked) and one where it
  must not (Watchdog excepted: it always fires);
- GpuXidCritical's severities follow the XID table, code by code (a generated promtool test);
- breaking a rule makes promtool fail (so the unit tests can fail);
- a real Prometheus loaded with the rules, scraping a real `gpumond agent --sim` with planted faults
  and a real `gpumond rules` with a starved rank, evaluates every rule without error and raises
  the expected alerts with the expected labels.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpumond.agent.policy.xid_table import XID_TABLE, xid_info
from gpumond.alerts.catalogue import ALERTS, runbook_url
from gpumond.config.rules import RulesConfig
from tests.integration.alert_helpers import RulesDaemon
from tests.integration.helpers import REPO_ROOT, AgentProcess, PrometheusServer, http_get, wait_until, write_yaml

pytestmark = pytest.mark.integration

RULES_DIR = REPO_ROOT / "deploy" / "prometheus"
RULE_FILES = sorted(RULES_DIR.glob("*.yml"))
TEST_FILES = sorted((RULES_DIR / "tests").glob("*.yml"))
ALWAYS_FIRING = {"Watchdog"}  # no case where it must not fire can exist


# ----- reading the YAML ---------------------------------------------------------------------------
def _alerting_rules(files: list[Path] = RULE_FILES) -> dict[str, list[dict[str, Any]]]:
    """alertname → its alerting rules (several rules may share one name, e.g. one per XID severity)."""
    rules: dict[str, list[dict[str, Any]]] = {}
    for path in files:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    rules.setdefault(rule["alert"], []).append(rule)
    return rules


def _rule_tests(files: list[Path] = TEST_FILES) -> list[dict[str, Any]]:
    """Every alert_rule_test entry of the promtool test files."""
    out = []
    for path in files:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for test in doc["tests"]:
            out.extend(test.get("alert_rule_test", []))
    return out


def _severities(name: str) -> set[str]:
    spec = ALERTS[name]
    if spec.severity is not None:
        return {spec.severity} | ({spec.dry_run_severity} if spec.dry_run_severity else set())
    assert name == "GpuXidCritical", f"{name}: only the XID alert takes its severity from a table"
    return {info.severity for info in XID_TABLE.values()} | {xid_info(-1).severity}


def _promtool(promtool: str, *args: str | Path, cwd: Path | None = None) -> tuple[int, str]:
    r = subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, timeout=60, check=False,
                       cwd=cwd)
    return r.returncode, r.stdout + r.stderr


# ----- promtool -----------------------------------------------------------------------------------
def test_the_rule_and_test_files_exist() -> None:
    assert RULE_FILES == [RULES_DIR / "gpumond.rules.yml"], RULE_FILES
    assert {p.name for p in TEST_FILES} >= {"gpu.test.yml", "gpu_events.test.yml", "training.test.yml",
                                          "self.test.yml"}, TEST_FILES


def test_promtool_check_rules_passes_without_warnings(promtool: str) -> None:
    rc, out = _promtool(promtool, "check", "rules", *RULE_FILES)
    assert rc == 0, out
    assert "SUCCESS" in out and "WARNING" not in out.upper(), out


def test_promtool_unit_tests_pass(promtool: str) -> None:
    rc, out = _promtool(promtool, "test", "rules", *TEST_FILES)
    assert rc == 0, out
    assert out.count("SUCCESS") == len(TEST_FILES), out


@pytest.mark.parametrize("mutate, why, tests", [
    (lambda s: s.replace("        for: 15s\n", "        for: 5m\n", 1), "GpuLost's `for:`", "gpu.test.yml"),
    (lambda s: s.replace('kind="io_starved_job"', 'kind="io_starved_jobs"', 1), "a finding kind",
     "training.test.yml"),
    (lambda s: s.replace('"48|62|64|74|79|95|119|120"', '"48|62|64|74|95|119|120"'), "a critical XID code",
     "gpu_events.test.yml"),
    (lambda s: s.replace("unless on (instance, gpu, uuid, xid) gpumond_gpu_xid_errors_total offset 15m",
                         "unless on (instance, gpu, uuid, xid) gpumond_gpu_xid_errors_total offset 1m", 1),
     "the first-event branch of the XID rule", "gpu_events.test.yml"),
    (lambda s: s.replace('exported_job", "(.+)"', 'exported_job", "(x.+)"', 1), "the honor_labels handling",
     "training.test.yml"),
    (lambda s: s.replace("time() - gpumond_alert_sink_last_success_timestamp_seconds < 900",
                         "time() - gpumond_alert_sink_last_success_timestamp_seconds < 9000", 1),
     "the stalled-sink window", "self.test.yml"),
])
def test_a_broken_rule_fails_the_unit_tests(promtool: str, tmp_path: Path, mutate, why: str, tests: str) -> None:
    """The unit tests can fail: each of these one-line breakages must make `promtool test rules` fail."""
    original = (RULES_DIR / "gpumond.rules.yml").read_text(encoding="utf-8")
    broken = mutate(original)
    assert broken != original, f"the mutation of {why} no longer applies: update this test"
    (tmp_path / "gpumond.rules.yml").write_text(broken, encoding="utf-8")
    (tmp_path / "tests").mkdir()
    shutil.copy(RULES_DIR / "tests" / tests, tmp_path / "tests" / tests)
    rc, out = _promtool(promtool, "check", "rules", tmp_path / "gpumond.rules.yml")
    assert rc == 0, f"the broken file should still be valid YAML and PromQL: {out}"
    rc, out = _promtool(promtool, "test", "rules", tmp_path / "tests" / tests)
    assert rc != 0 and "FAILED" in out, f"breaking {why} went unnoticed by {tests}:\n{out}"


# ----- the rules against the catalogue ------------------------------------------------------------
def test_every_catalogue_alert_has_a_rule_with_its_severity_and_annotations() -> None:
    rules = _alerting_rules()
    missing = sorted(set(ALERTS) - set(rules))
    assert not missing, f"catalogue alerts without a Prometheus rule: {missing}"
    for name, spec in ALERTS.items():
        severities = {r.get("labels", {}).get("severity") for r in rules[name]}
        assert severities == _severities(name), f"{name}: rule severities {severities}"
        for rule in rules[name]:
            ann = rule.get("annotations", {})
            assert set(ann) == {"summary", "description", "runbook_url"}, f"{name}: annotations {sorted(ann)}"
            assert ann["runbook_url"] == runbook_url(name), f"{name}: runbook_url {ann['runbook_url']}"
            assert ann["summary"].endswith(spec.summary) or f": {spec.summary} (" in ann["summary"] \
                or ann["summary"] == spec.summary, f"{name}: summary {ann['summary']!r} lacks {spec.summary!r}"
            assert ann["description"].strip(), name


def test_no_rule_raises_an_alert_outside_the_catalogue() -> None:
    unknown = sorted(set(_alerting_rules()) - set(ALERTS))
    assert not unknown, f"alerting rules whose alertname is not in gpumond.alerts.catalogue: {unknown}"


def test_gpu_alerts_wait_as_long_as_the_agent_does() -> None:
    """`for:` follows the agent's defaults (PolicyAlertsConfig, LOST_FOR_S); events have no `for:`."""
    from gpumond.agent.policy.alert_rules import LOST_FOR_S, NVLINK_DOWN_FOR_S
    from gpumond.config.agent import PolicyAlertsConfig

    cfg = PolicyAlertsConfig()
    seconds = {"s": 1, "m": 60, "h": 3600}

    def for_s(rule: dict[str, Any]) -> float:
        text = rule.get("for", "0s")
        return float(text[:-1]) * seconds[text[-1]]

    expected = {"GpuLost": LOST_FOR_S, "GpuPowerCapAtFloor": cfg.floor_after_s, "GpuNvLinkDown": NVLINK_DOWN_FOR_S,
                **dict.fromkeys(["GpuHwThermalSlowdown", "GpuHwSlowdown", "GpuHwPowerBrakeSlowdown",
                                 "GpuSwThermalSlowdown"], cfg.throttle_after_s),
                **dict.fromkeys(["GpuEccUncorrectedIncreasing", "GpuRowRemapPending", "GpuRowRemapFailed",
                                 "GpuXidCritical"], 0.0)}
    rules = _alerting_rules()
    for name, want in expected.items():
        assert {for_s(r) for r in rules[name]} == {want}, name
    hold = f"[{int(cfg.event_hold_s // 60)}m]"
    for name in ("GpuEccUncorrectedIncreasing", "GpuXidCritical"):
        assert all(hold in r["expr"] for r in rules[name]), f"{name} should look back event_hold_s {hold}"


def test_training_alerts_read_the_finding_kind_of_the_catalogue() -> None:
    rules = _alerting_rules()
    for name, spec in ALERTS.items():
        if spec.finding_kind is None:
            continue
        exprs = [r["expr"] for r in rules[name]]
        assert exprs == [f'max without (kind) (gpumond:finding:firing{{kind="{spec.finding_kind}"}})'], \
            f"{name}: {exprs}"


def test_xid_rule_regexes_are_the_tables_critical_and_application_codes() -> None:
    critical = {c for c, i in XID_TABLE.items() if i.severity == "critical"}
    info = {c for c, i in XID_TABLE.items() if i.severity == "info"}
    assert info == {13, 31, 43, 45, 68} and all(XID_TABLE[c].application for c in info)
    by_severity = {r["labels"]["severity"]: r["expr"] for r in _alerting_rules()["GpuXidCritical"]}

    def codes(expr: str, op: str) -> set[int]:
        found = {frozenset(int(c) for c in m.split("|")) for m in re.findall(rf'xid{op}"([0-9|]+)"', expr)}
        assert len(found) == 1, f"one code set per rule expected in {expr}"
        return set(next(iter(found)))

    assert codes(by_severity["critical"], "=~") == critical
    assert codes(by_severity["info"], "=~") == info
    assert codes(by_severity["warning"], "!~") == critical | info


def test_every_alert_has_a_firing_and_a_quiet_promtool_case() -> None:
    cases = _rule_tests()
    for name in ALERTS:
        mine = [c for c in cases if c["alertname"] == name]
        firing = [c for c in mine if c.get("exp_alerts")]
        quiet = [c for c in mine if not c.get("exp_alerts")]
        assert firing, f"{name}: no promtool case where it fires"
        assert quiet or name in ALWAYS_FIRING, f"{name}: no promtool case where it must not fire"
        seen_severities = set()
        for case in firing:
            for exp in case["exp_alerts"]:
                labels, ann = exp.get("exp_labels", {}), exp.get("exp_annotations", {})
                assert labels.get("alertname") == name, (name, labels)
                seen_severities.add(labels.get("severity"))
                assert ann.get("summary") and ann.get("runbook_url") == runbook_url(name), (name, ann)
        assert seen_severities <= _severities(name), (name, seen_severities)
    assert {c["alertname"] for c in cases} <= set(ALERTS), "a promtool case tests an alert outside the catalogue"


def test_xid_severity_follows_the_table_code_by_code(promtool: str, tmp_path: Path) -> None:
    """A generated promtool test: one GPU per XID code of the table plus an unknown code."""
    codes = [*sorted(XID_TABLE), 9999]
    series, expected = [], []
    for i, code in enumerate(codes):
        uuid = f"GPU-{i:04d}"
        labels = f'instance="n:9480",job="gpumond-agent",gpu="{i}",uuid="{uuid}"'
        series.append({"series": f'gpumond_gpu_info{{{labels},hostname="gpu-node-01"}}', "values": "1x5"})
        series.append({"series": f'gpumond_gpu_xid_errors_total{{{labels},xid="{code}"}}', "values": "_ 1x4"})
        expected.append({
            "exp_labels": {"alertname": "GpuXidCritical", "severity": xid_info(code).severity,
                           "node": "gpu-node-01", "gpu": str(i), "uuid": uuid, "xid": str(code)},
        })
    spec = {"rule_files": [str(RULES_DIR / "gpumond.rules.yml")], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series,
                       "alert_rule_test": [{"alertname": "GpuXidCritical", "eval_time": "2m",
                                            "exp_alerts": expected}]}]}
    # promtool compares annotations too: take them from what the rule renders for each alert.
    rule = _alerting_rules()["GpuXidCritical"][0]["annotations"]
    for i, (code, exp) in enumerate(zip(codes, expected, strict=True)):
        exp["exp_annotations"] = {
            "summary": f"GPU {i} on gpu-node-01: XID error (XID {code})",
            "description": (f"The driver reported XID {code} on GPU {i} (GPU-{i:04d}) on gpu-node-01, about 1 "
                            "time(s) in the last 15 minutes. What the code means and what to do: "
                            "https://github.com/gpumond/gpumond/blob/main/docs/xid.md"),
            "runbook_url": rule["runbook_url"],
        }
    path = write_yaml(tmp_path / "xid.test.yml", spec)
    rc, out = _promtool(promtool, "test", "rules", path)
    assert rc == 0, out


# ----- a real Prometheus with the rules, a real agent and a real rules service --------------------
NODE = "sim-node-07"
TOKEN = "rules-test-token-0123456789abcdef"
SCENARIO = {
    "faults": [
        # Late enough that Prometheus has scraped the healthy values first (an increase needs two samples).
        {"gpu": 0, "kind": "xid", "at_s": 8, "code": 48},
        {"gpu": 0, "kind": "ecc_uncorrected", "at_s": 8, "count": 1},
        {"gpu": 1, "kind": "lost", "at_s": 8},
    ],
}


class RulesProcess(RulesDaemon):
    """The rules service, ready once it has said where it serves and /healthz answers."""

    def ready(self) -> bool:
        # Its own "serving" line first: a 200 from a process that won the race for the port is not ours.
        return f"{self.base_url}/" in self.stderr() and super().ready()

    def push(self, body: dict[str, Any]) -> int:
        req = urllib.request.Request(f"{self.base_url}/api/v1/push", data=json.dumps(body).encode(),
                                     method="POST", headers={"Authorization": f"Bearer {TOKEN}",
                                                             "Content-Type": "application/json"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=5) as resp:
            return resp.status


class PrometheusWithRules(PrometheusServer):
    """The fixture's Prometheus (scraping and evaluating every second), with gpumond's rule files loaded."""

    def __init__(self, *args: Any, rule_files: list[Path], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = yaml.safe_load(self.config_path.read_text(encoding="utf-8"))
        config["rule_files"] = [str(p) for p in rule_files]
        write_yaml(self.config_path, config)

    def api(self, path: str) -> Any:
        status, _, body = http_get(f"{self.base_url}{path}")
        assert status == 200, body[:500]
        return json.loads(body)["data"]


class Stack:
    def __init__(self, agent: AgentProcess, rules: RulesProcess, prom: PrometheusWithRules, uuids: dict[str, str]):
        self.agent, self.rules, self.prom, self.uuids = agent, rules, prom, uuids


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("rules-stack")
    scenario = write_yaml(work / "scenario.yaml", SCENARIO)
    agent_cfg = write_yaml(work / "agent.yaml", {"node_name": NODE, "state_dir": str(work / "state"),
                                                 "sampling": {"fast_interval_s": 1, "slow_interval_s": 1}})
    agent = AgentProcess(["--sim", "2", "--sim-scenario", scenario, "--config", agent_cfg], work / "agent")
    rules_cfg: dict[str, Any] = {"tokens": [TOKEN], "evaluation_interval_s": 1}
    if "state_dir" in RulesConfig.model_fields:  # keep its alert state out of the machine's default directory
        rules_cfg["state_dir"] = str(work / "rules-state")
    if "findings" in RulesConfig.model_fields:  # fire within seconds, as before durations were wall time
        rules_cfg["findings"] = {"min_duration_s": 1, "resolve_after_s": 3}
    rules = RulesProcess(work / "rules", rules_cfg)
    agent.spawn()
    try:
        rules.start()
        agent.wait_ready()
        prom = PrometheusWithRules([agent.address], work / "prometheus", job="gpumond-agent",
                                   extra_scrape_configs=[{"job_name": "gpumond-rules",
                                                          "static_configs": [{"targets": [rules.address]}]}],
                                   rule_files=RULE_FILES)
        with prom:
            info = prom.wait_for("gpumond_gpu_info", lambda r: len(r) == 2, timeout=20,
                                 what="Prometheus to see the agent's two GPUs")
            uuids = {r["metric"]["gpu"]: r["metric"]["uuid"] for r in info}
            _push_a_starved_rank(rules)
            yield Stack(agent, rules, prom, uuids)
    finally:
        for proc in (agent, rules):
            if proc.proc is not None:
                proc.stop()


def _push_a_starved_rank(rules: RulesProcess) -> None:
    """Eight ranks of job-a with a minute of 1 s steps; rank 5 waits 30 % of each step on its data loader."""
    now = time.time()
    for rank in range(8):
        steps = [{"step": s, "end": now - 60 + s, "duration_s": 1.0, "data_wait_s": 0.3 if rank == 5 else 0.001}
                 for s in range(60)]
        body = {"job": "job-a", "rank": rank, "world_size": 8, "node": f"node-{rank // 4}",
                "gpu_uuid": f"GPU-{rank:08d}-0000-0000-0000-000000000000", "steps": steps}
        assert rules.push(body) == 202


def _alerts(prom: PrometheusWithRules) -> list[dict[str, Any]]:
    return list(prom.api("/api/v1/alerts")["alerts"])


def test_real_prometheus_evaluates_every_rule_without_error(stack: Stack) -> None:
    def all_evaluated() -> list[dict[str, Any]] | None:
        rules = [r for g in stack.prom.api("/api/v1/rules")["groups"] for r in g["rules"]]
        return rules if rules and all(not r["lastEvaluation"].startswith("0001-") for r in rules) else None

    rules = wait_until(all_evaluated, timeout=20, what="every rule to have been evaluated once")
    groups = {g["name"] for g in stack.prom.api("/api/v1/rules")["groups"]}
    assert groups == {"gpumond-gpu", "gpumond-training", "gpumond-self", "gpumond-remediation"}, groups
    bad = [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, f"rules failing on real data: {bad}"
    # The recording rule found the node of every GPU.
    nodes = stack.prom.wait_for("gpumond:gpu_node:info", lambda r: len(r) == 2, timeout=10)
    assert {(r["metric"]["gpu"], r["metric"]["node"]) for r in nodes} == {("0", NODE), ("1", NODE)}


def test_real_prometheus_raises_the_planted_faults_with_the_agent_labels(stack: Stack) -> None:
    gpu0, gpu1 = stack.uuids["0"], stack.uuids["1"]
    want_firing = {
        ("GpuXidCritical", "critical", "0", gpu0, "48"),
        ("GpuXidCritical", "critical", "1", gpu1, "79"),   # the lost GPU's XID 79
        ("GpuEccUncorrectedIncreasing", "critical", "0", gpu0, None),
        ("GpuRowRemapPending", "warning", "0", gpu0, None),
    }

    def key(a: dict[str, Any]) -> tuple[Any, ...]:
        lb = a["labels"]
        return lb["alertname"], lb["severity"], lb.get("gpu"), lb.get("uuid"), lb.get("xid")

    def seen() -> list[dict[str, Any]] | None:
        alerts = _alerts(stack.prom)
        firing = {key(a) for a in alerts if a["state"] == "firing"}
        lost = [a for a in alerts if a["labels"]["alertname"] == "GpuLost"]
        return alerts if want_firing <= firing and lost else None

    alerts = wait_until(seen, timeout=30, interval=0.5, what=f"alerts {sorted(map(str, want_firing))} and GpuLost")
    gpu_alerts = [a for a in alerts if a["labels"]["alertname"].startswith("Gpu")
                  and not a["labels"]["alertname"].startswith("Gpumond")]
    for a in gpu_alerts:
        extra = {"xid"} if a["labels"]["alertname"] == "GpuXidCritical" else set()
        assert set(a["labels"]) == {"alertname", "severity", "node", "gpu", "uuid"} | extra, a["labels"]
        assert a["labels"]["node"] == NODE, a["labels"]
        assert a["annotations"]["runbook_url"] == runbook_url(a["labels"]["alertname"])
        assert a["annotations"]["summary"].startswith(f"GPU {a['labels']['gpu']} on {NODE}: "), a["annotations"]
    lost = [a for a in alerts if a["labels"]["alertname"] == "GpuLost"]
    assert [(a["labels"]["gpu"], a["labels"]["uuid"]) for a in lost] == [("1", gpu1)], lost
    # Nothing else is wrong on this node: no thermal, power-cap or self-health alert.
    names = {a["labels"]["alertname"] for a in alerts}
    assert names <= {"GpuXidCritical", "GpuEccUncorrectedIncreasing", "GpuRowRemapPending", "GpuLost", "Watchdog",
                     "TrainingIoStarvedRank"}, names
    assert any(a["labels"]["alertname"] == "Watchdog" and a["state"] == "firing" for a in alerts)


def test_real_prometheus_turns_a_scraped_finding_into_its_training_alert(stack: Stack) -> None:
    """Scraped with the default honor_labels: false, the training job arrives as exported_job."""
    raw = stack.prom.wait_for('gpumond_finding{kind="io_starved_rank"}', timeout=20,
                              what="the rules service's io_starved_rank finding in Prometheus")
    assert raw[0]["metric"]["exported_job"] == "job-a" and raw[0]["metric"]["job"] == "gpumond-rules", raw

    def firing() -> list[dict[str, Any]] | None:
        found = [a for a in _alerts(stack.prom)
                 if a["labels"]["alertname"] == "TrainingIoStarvedRank" and a["state"] == "firing"]
        return found or None

    (alert,) = wait_until(firing, timeout=20, interval=0.5, what="TrainingIoStarvedRank to fire")
    assert alert["labels"] == {"alertname": "TrainingIoStarvedRank", "severity": "warning", "job": "job-a",
                               "node": "node-1", "rank": "5", "uuid": "GPU-00000005-0000-0000-0000-000000000000"}, \
        alert["labels"]
    assert alert["annotations"]["summary"] == "rank 5 (node-1) of job job-a: rank starved by its data loader"
    assert alert["annotations"]["runbook_url"] == runbook_url("TrainingIoStarvedRank")
