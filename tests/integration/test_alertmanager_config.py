"""deploy/alertmanager: amtool validates the example; its routing, grouping, inhibition and templates work.

- `amtool check-config` passes (config and templates);
- `amtool config routes test`: critical → pagerduty, warning and info → slack, Watchdog → the
  dead-man's switch, for every alert of the catalogue at each of its severities;
- secrets are read from files, never written in the example;
- a real `prometheus-alertmanager` on 127.0.0.1 with a copy of the example whose receivers point to
  a local HTTP receiver: the inhibition rules hide exactly what they should (read back from
  /api/v2/alerts), alerts are grouped by alertname+node (GPU) and alertname+job (Training*), and the
  Slack, PagerDuty and dead-man's-switch notifications that arrive carry severity, node, GPU, job,
  summary and the runbook link.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpumond.agent.policy.xid_table import XID_TABLE
from gpumond.alerts.catalogue import ALERTS, runbook_url
from tests.integration.alert_helpers import Alertmanager
from tests.integration.helpers import LOOPBACK, REPO_ROOT, free_port, require_binary, wait_until, write_yaml

pytestmark = pytest.mark.integration

AM_DIR = REPO_ROOT / "deploy" / "alertmanager"
CONFIG = AM_DIR / "alertmanager.yml"
TEMPLATE = AM_DIR / "gpumond.tmpl"
PD_KEY = "FAKE-ROUTING-KEY-0123456789abcdef"


def _amtool(*args: str | Path) -> tuple[int, str]:
    r = subprocess.run([require_binary("amtool"), *map(str, args)], capture_output=True, text=True, timeout=30,
                       check=False)
    return r.returncode, r.stdout + r.stderr


def _route(config: Path, **labels: str) -> tuple[int, str]:
    """amtool's answer to "which receiver gets these labels": (exit code, receivers comma-separated)."""
    r = subprocess.run([require_binary("amtool"), "config", "routes", "test", f"--config.file={config}",
                        *(f"{k}={v}" for k, v in labels.items())], capture_output=True, text=True, timeout=30,
                       check=False)
    return r.returncode, r.stdout.strip()


# ----- amtool -------------------------------------------------------------------------------------
def test_amtool_check_config_passes() -> None:
    rc, out = _amtool("check-config", CONFIG)
    assert rc == 0, out
    assert "1 templates" in out and "3 receivers" in out and "5 inhibit rules" in out, out


def test_amtool_check_config_fails_on_a_broken_template(tmp_path: Path) -> None:
    """amtool reads the template file: the check above would catch a broken one."""
    shutil.copy(CONFIG, tmp_path / CONFIG.name)
    (tmp_path / TEMPLATE.name).write_text(TEMPLATE.read_text(encoding="utf-8").replace("{{- end }}", "", 1),
                                          encoding="utf-8")
    rc, out = _amtool("check-config", tmp_path / CONFIG.name)
    assert rc != 0, out


@pytest.mark.parametrize("labels, receiver", [
    ({"alertname": "GpuLost", "severity": "critical", "node": "gpu-node-01", "uuid": "GPU-a"}, "pagerduty"),
    ({"alertname": "GpuSwThermalSlowdown", "severity": "warning", "node": "gpu-node-01"}, "slack"),
    ({"alertname": "GpuXidCritical", "severity": "critical", "xid": "79"}, "pagerduty"),
    ({"alertname": "GpuXidCritical", "severity": "info", "xid": "13"}, "slack"),
    ({"alertname": "TrainingRankHung", "severity": "critical", "job": "llama"}, "pagerduty"),
    ({"alertname": "TrainingStraggler", "severity": "warning", "job": "llama"}, "slack"),
    ({"alertname": "GpumondAgentDown", "severity": "critical", "instance": "n:9480"}, "pagerduty"),
    ({"alertname": "GpumondCollectorFailing", "severity": "warning"}, "slack"),
    ({"alertname": "Watchdog", "severity": "info"}, "deadmans-switch"),
    ({"alertname": "SomethingElse", "severity": "critical"}, "slack"),  # outside gpumond: the fallback
])
def test_routes(labels: dict[str, str], receiver: str) -> None:
    rc, out = _route(CONFIG, **labels)
    assert (rc, out) == (0, receiver), labels


def test_every_catalogue_alert_routes_by_its_severity() -> None:
    severities_of_xids = {i.severity for i in XID_TABLE.values()} | {"warning"}
    for name, spec in ALERTS.items():
        for severity in [spec.severity] if spec.severity else sorted(severities_of_xids):
            want = "deadmans-switch" if name == "Watchdog" else "pagerduty" if severity == "critical" else "slack"
            assert _route(CONFIG, alertname=name, severity=severity) == (0, want), (name, severity)


def test_secrets_come_from_files_and_placeholders_are_obvious() -> None:
    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    receivers = {r["name"]: r for r in config["receivers"]}
    for r in receivers.values():
        for pd in r.get("pagerduty_configs", []):
            assert "routing_key" not in pd and pd["routing_key_file"].startswith("/etc/alertmanager/secrets/")
        for sl in r.get("slack_configs", []):
            assert "api_url" not in sl and sl["api_url_file"].startswith("/etc/alertmanager/secrets/")
    (hook,) = receivers["deadmans-switch"]["webhook_configs"]
    assert ".invalid/" in hook["url"] and "REPLACE" in hook["url"], hook


# ----- a real Alertmanager ------------------------------------------------------------------------
class Receiver:
    """A local HTTP server standing in for Slack, PagerDuty and the dead-man's switch: records every POST."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, Any]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with outer.lock:
                    outer.posts.append((self.path, json.loads(body)))
                status, reply = (202, b'{"status":"success"}') if self.path == "/pagerduty" else (200, b"ok")
                self.send_response(status)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.url = f"http://{LOOPBACK}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def bodies(self, path: str) -> list[Any]:
        with self.lock:
            return [b for p, b in self.posts if p == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _live_config(workdir: Path, receiver: Receiver) -> Path:
    """The example with its receivers pointed at `receiver` and notifications sent at once; nothing else changed."""
    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    (workdir / "pagerduty-key").write_text(PD_KEY + "\n", encoding="utf-8")
    (workdir / "slack-url").write_text(f"{receiver.url}/slack\n", encoding="utf-8")
    for r in config["receivers"]:
        for pd in r.get("pagerduty_configs", []):
            pd["routing_key_file"] = str(workdir / "pagerduty-key")
            pd["url"] = f"{receiver.url}/pagerduty"
        for sl in r.get("slack_configs", []):
            sl["api_url_file"] = str(workdir / "slack-url")
        for hook in r.get("webhook_configs", []):
            hook["url"] = f"{receiver.url}/deadman"

    def fast(route: dict[str, Any]) -> None:
        if "group_wait" in route:
            route["group_wait"] = "0s"
        for child in route.get("routes", []):
            fast(child)

    fast(config["route"])
    config["route"]["group_wait"] = "0s"
    shutil.copy(TEMPLATE, workdir / TEMPLATE.name)  # `templates:` is relative to the config file
    return write_yaml(workdir / "alertmanager.yml", config)


def _alert(name: str, severity: str, **labels: str) -> dict[str, Any]:
    now = datetime.now(tz=UTC)
    lb = {"alertname": name, "severity": severity, **labels}
    where = " ".join(f"{k}={v}" for k, v in labels.items())
    return {"labels": lb,
            "annotations": {"summary": f"{where}: {ALERTS[name].summary}",
                            "description": f"{ALERTS[name].meaning} ({where})", "runbook_url": runbook_url(name)},
            "startsAt": now.isoformat(), "endsAt": (now + timedelta(minutes=10)).isoformat()}


GPU = {"node": "gpu-node-01"}
ALERTS_SENT = [
    # GPU-aaaa is lost: its thermal and power-cap alerts are inhibited; GPU-bbbb's are not.
    _alert("GpuLost", "critical", **GPU, gpu="0", uuid="GPU-aaaa"),
    _alert("GpuHwThermalSlowdown", "critical", **GPU, gpu="0", uuid="GPU-aaaa"),
    _alert("GpuPowerCapAtFloor", "warning", **GPU, gpu="0", uuid="GPU-aaaa"),
    _alert("GpuHwThermalSlowdown", "critical", **GPU, gpu="1", uuid="GPU-bbbb"),
    # Two GPUs of one node in software thermal slowdown: one notification.
    _alert("GpuSwThermalSlowdown", "warning", node="gpu-node-03", gpu="0", uuid="GPU-c0"),
    _alert("GpuSwThermalSlowdown", "warning", node="gpu-node-03", gpu="1", uuid="GPU-c1"),
    # A critical XID hides a warning XID on the same GPU, not on another.
    _alert("GpuXidCritical", "critical", node="gpu-node-02", gpu="2", uuid="GPU-cccc", xid="79"),
    _alert("GpuXidCritical", "warning", node="gpu-node-02", gpu="2", uuid="GPU-cccc", xid="63"),
    _alert("GpuXidCritical", "warning", node="gpu-node-02", gpu="3", uuid="GPU-dddd", xid="63"),
    # vit-h's data pipeline is starved: its rank findings are inhibited; llama's stragglers are not.
    _alert("TrainingIoStarvedJob", "warning", job="vit-h"),
    _alert("TrainingIoStarvedRank", "warning", job="vit-h", node="gpu-node-05", rank="3",
           uuid="GPU-e3"),
    _alert("TrainingStraggler", "warning", job="vit-h", node="gpu-node-05", rank="5",
           uuid="GPU-e5"),
    _alert("TrainingStraggler", "warning", job="llama-70b", node="gpu-node-06", rank="17",
           uuid="GPU-f1"),
    _alert("TrainingStraggler", "warning", job="llama-70b", node="gpu-node-07", rank="18",
           uuid="GPU-f2"),
    _alert("Watchdog", "info"),
]


def _key(labels: dict[str, str]) -> tuple[str, ...]:
    return labels["alertname"], labels.get("uuid", ""), labels.get("xid", ""), labels.get("job", "")


INHIBITED = {
    ("GpuHwThermalSlowdown", "GPU-aaaa", "", ""),
    ("GpuPowerCapAtFloor", "GPU-aaaa", "", ""),
    ("GpuXidCritical", "GPU-cccc", "63", ""),
    ("TrainingIoStarvedRank", "GPU-e3", "", "vit-h"),
    ("TrainingStraggler", "GPU-e5", "", "vit-h"),
}


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Alertmanager, Receiver]]:
    work = tmp_path_factory.mktemp("alertmanager")
    receiver = Receiver()
    try:
        config = _live_config(work, receiver)
        rc, out = _amtool("check-config", config)
        assert rc == 0, f"the test's copy of the config is invalid: {out}"
        with Alertmanager(work, config).start() as am:
            # Inhibiting alerts first, and held, before the alerts they hide: posted together, a group may
            # flush before Alertmanager has marked its inhibited members (seen on a loaded machine).
            sources = [a for a in ALERTS_SENT if _key(a["labels"]) not in INHIBITED]
            am.post_alerts(sources)
            wait_until(lambda: len(am.get("/api/v2/alerts")) >= len(sources), timeout=10,
                       what="Alertmanager to hold the inhibiting alerts")
            am.post_alerts([a for a in ALERTS_SENT if a not in sources])
            yield am, receiver
    finally:
        receiver.close()


def test_inhibition_hides_exactly_the_explained_alerts(alertmanager) -> None:
    am, _ = alertmanager

    def all_there() -> list[dict[str, Any]] | None:
        got = am.get("/api/v2/alerts")
        return got if len(got) == len(ALERTS_SENT) else None

    everything = wait_until(all_there, timeout=10, what=f"Alertmanager to hold the {len(ALERTS_SENT)} alerts")
    fingerprints = {_key(a["labels"]): a["fingerprint"] for a in everything}

    def settled() -> list[dict[str, Any]] | None:
        visible = am.get("/api/v2/alerts?inhibited=false")
        return visible if len(visible) == len(ALERTS_SENT) - len(INHIBITED) else None

    visible = wait_until(settled, timeout=10, what="the inhibited alerts to drop out of ?inhibited=false")
    hidden = {_key(a["labels"]) for a in everything} - {_key(a["labels"]) for a in visible}
    assert hidden == INHIBITED
    only_inhibited = am.get("/api/v2/alerts?active=false&silenced=false&unprocessed=false&inhibited=true")
    assert {_key(a["labels"]) for a in only_inhibited} == INHIBITED
    by_key = {_key(a["labels"]): a for a in everything}
    sources = {
        ("GpuHwThermalSlowdown", "GPU-aaaa", "", ""): ("GpuLost", "GPU-aaaa", "", ""),
        ("GpuPowerCapAtFloor", "GPU-aaaa", "", ""): ("GpuLost", "GPU-aaaa", "", ""),
        ("GpuXidCritical", "GPU-cccc", "63", ""): ("GpuXidCritical", "GPU-cccc", "79", ""),
        ("TrainingIoStarvedRank", "GPU-e3", "", "vit-h"): ("TrainingIoStarvedJob", "", "", "vit-h"),
        ("TrainingStraggler", "GPU-e5", "", "vit-h"): ("TrainingIoStarvedJob", "", "", "vit-h"),
    }
    status = am.get("/api/v2/alerts")
    for target, source in sources.items():
        (alert,) = [a for a in status if _key(a["labels"]) == target]
        assert alert["status"]["state"] == "suppressed", alert["status"]
        assert alert["status"]["inhibitedBy"] == [fingerprints[source]], (target, alert["status"])
    visible_keys = {_key(a["labels"]) for a in status if a["status"]["state"] == "active"}
    assert visible_keys == set(by_key) - INHIBITED, visible_keys


def test_groups_are_per_alertname_and_node_for_gpus_and_per_alertname_and_job_for_training(alertmanager) -> None:
    am, _ = alertmanager

    def groups() -> list[dict[str, Any]] | None:
        got = am.get("/api/v2/alerts/groups")
        return got if sum(len(g["alerts"]) for g in got) == len(ALERTS_SENT) else None

    found = wait_until(groups, timeout=10, what="every alert in a group")
    by_labels = {tuple(sorted(g["labels"].items())): g for g in found}
    sw = by_labels[(("alertname", "GpuSwThermalSlowdown"), ("node", "gpu-node-03"))]
    assert sorted(a["labels"]["uuid"] for a in sw["alerts"]) == ["GPU-c0", "GPU-c1"]
    assert sw["receiver"]["name"] == "slack"
    llama = by_labels[(("alertname", "TrainingStraggler"), ("job", "llama-70b"))]
    assert sorted(a["labels"]["rank"] for a in llama["alerts"]) == ["17", "18"]
    lost = by_labels[(("alertname", "GpuLost"), ("node", "gpu-node-01"))]
    assert lost["receiver"]["name"] == "pagerduty"
    watchdog = by_labels[(("alertname", "Watchdog"),)]
    assert watchdog["receiver"]["name"] == "deadmans-switch"


def _slack_attachments(receiver: Receiver) -> list[dict[str, Any]]:
    return [att for body in receiver.bodies("/slack") for att in body.get("attachments", [])]


def test_notifications_reach_pagerduty_slack_and_the_deadmans_switch(alertmanager) -> None:
    _, receiver = alertmanager
    expected_slack = {"GpuLost", "GpuHwThermalSlowdown", "GpuSwThermalSlowdown", "GpuXidCritical",
                      "TrainingIoStarvedJob", "TrainingStraggler"}

    def delivered() -> bool:
        titles = " ".join(a.get("title", "") for a in _slack_attachments(receiver))
        pd = {b["payload"]["summary"] for b in receiver.bodies("/pagerduty")}
        return all(n in titles for n in expected_slack) and len(pd) >= 3 and receiver.bodies("/deadman")

    wait_until(delivered, timeout=20, interval=0.2, what="Slack, PagerDuty and dead-man's-switch notifications",
               describe=lambda: repr(receiver.posts)[:3000])

    # The dead-man's switch gets the Watchdog and nothing else.
    for body in receiver.bodies("/deadman"):
        assert [a["labels"]["alertname"] for a in body["alerts"]] == ["Watchdog"], body

    # PagerDuty: critical alerts only, with the key from the file, severity, and the runbook link.
    pd = receiver.bodies("/pagerduty")
    for body in pd:
        assert body["routing_key"] == PD_KEY and body["event_action"] == "trigger", body
        assert body["payload"]["severity"] == "critical", body
        (link,) = body["links"]
        assert link["text"] == "Runbook" and link["href"].startswith(
            "https://github.com/gpumond/gpumond/blob/main/docs/runbooks/"), link
    lost = [b for b in pd if "GpuLost" in b["links"][0]["href"]]
    assert lost and lost[0]["payload"]["summary"] == "node=gpu-node-01 gpu=0 uuid=GPU-aaaa: GPU lost", lost
    assert "GPU-aaaa" in lost[0]["payload"]["custom_details"]["firing"]
    hrefs = {b["links"][0]["href"].rsplit("/", 1)[1] for b in pd}
    assert hrefs == {"GpuLost.md", "GpuHwThermalSlowdown.md", "GpuXidCritical.md"}, hrefs

    # Slack: title with status, alertname, severity and the group; text with node, GPU, job, rank,
    # summary, description and the runbook link. Inhibited alerts appear nowhere.
    atts = _slack_attachments(receiver)
    text = "\n".join(a["title"] + "\n" + a["text"] for a in atts)
    sw = [a for a in atts if "GpuSwThermalSlowdown" in a["title"]]
    assert sw[0]["title"] == "[FIRING:2] GpuSwThermalSlowdown (warning) node=gpu-node-03", sw[0]["title"]
    assert sw[0]["color"] == "warning"
    assert "node gpu-node-03 · GPU 0 (GPU-c0)" in sw[0]["text"] and "node gpu-node-03 · GPU 1 (GPU-c1)" in sw[0]["text"]
    assert f"Runbook: <{runbook_url('GpuSwThermalSlowdown')}|GpuSwThermalSlowdown>" in sw[0]["text"]
    assert sw[0]["title_link"] == runbook_url("GpuSwThermalSlowdown")
    llama = [a for a in atts if "TrainingStraggler" in a["title"] and "llama-70b" in a["title"]]
    assert llama and llama[0]["title"] == "[FIRING:2] TrainingStraggler (warning) job=llama-70b", llama
    assert "*WARNING*" in llama[0]["text"]
    assert "node gpu-node-06 (GPU-f1) · job llama-70b · rank 17" in llama[0]["text"], llama[0]["text"]
    assert "node gpu-node-07 (GPU-f2) · job llama-70b · rank 18" in llama[0]["text"], llama[0]["text"]
    assert ALERTS["TrainingStraggler"].meaning in llama[0]["text"]
    job_level = [a for a in atts if "TrainingIoStarvedJob" in a["title"]]
    assert "\njob vit-h\n" in job_level[0]["text"], job_level  # no node, GPU or rank: just the job
    crit = [a for a in atts if "GpuLost" in a["title"]]
    assert crit[0]["color"] == "danger" and "*CRITICAL*" in crit[0]["text"], crit
    for hidden in ("GPU-e3", "GPU-e5", "rank 3", "rank 5", "uuid=GPU-cccc xid=63"):
        assert hidden not in text, f"inhibited alert {hidden} was notified:\n{text}"
    thermal = [a for a in atts if "GpuHwThermalSlowdown" in a["title"]]
    assert all("GPU-aaaa" not in a["text"] and "GPU-bbbb" in a["text"] for a in thermal), thermal
    assert "Watchdog" not in text
