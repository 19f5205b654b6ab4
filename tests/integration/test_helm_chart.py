"""deploy/helm/gpumond, rendered and linted by the real Helm engine, checked as a cluster and gpumond would check it.

Every values file under ci/ (and the defaults) must lint clean, render objects that validate strictly against
the Kubernetes schemas (or the structural check of the Prometheus Operator kinds), and render configs that
`gpumond check-config` accepts; the rendered agent and rules containers, started as rendered, must serve what
their probes ask for.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from gpumond import __version__
from tests.integration.helm_helpers import (CHART, EXISTING_SECRET, NAMESPACE, RELEASE, check_config, config_of,
                                            container_of, crd_problems, kinds, notes, one, pod_security_violations,
                                            render, render_chart, rendered, run_rendered, validation_problems,
                                            values_of, workload)
from tests.integration.helpers import LOOPBACK, REPO_ROOT, http_get, wait_until

pytestmark = pytest.mark.integration

VALUES_FILES = [None, *sorted(f"ci/{p.name}" for p in (CHART / "ci").glob("*-values.yaml"))]
VALUE_IDS = ["defaults" if f is None else Path(f).stem for f in VALUES_FILES]

# The objects each values file must render, by kind (the report quotes this table). Services: the agent's,
# the relay's (agent.relay.expose: service), the rules service's (and its shards' headless one).
EXPECTED_KINDS = {
    "defaults": {"ConfigMap": 2, "DaemonSet": 1, "Service": 3, "Deployment": 1, "Secret": 1},
    "readonly-values": {"ConfigMap": 2, "DaemonSet": 1, "Service": 3, "Deployment": 1, "Secret": 1},
    "sharded-values": {"ConfigMap": 2, "DaemonSet": 1, "Service": 4, "StatefulSet": 1, "Secret": 1},
    "existing-secret-values": {"ConfigMap": 2, "DaemonSet": 1, "Service": 3, "Deployment": 1},
    "monitors-values": {"ConfigMap": 5, "DaemonSet": 1, "Service": 3, "Deployment": 1, "Secret": 1,
                        "ServiceMonitor": 2, "PrometheusRule": 1},  # ConfigMaps: 2 configs + 3 dashboards
    "gpu-operator-values": {"ConfigMap": 2, "DaemonSet": 1, "Service": 3, "Deployment": 1, "Secret": 1,
                            "PodMonitor": 2},
    "eks-values": {"ConfigMap": 2, "DaemonSet": 1, "Service": 3, "Deployment": 1, "Secret": 1},
    "tls-values": {"ConfigMap": 2, "DaemonSet": 1, "Service": 3, "Deployment": 1, "Secret": 1, "ServiceMonitor": 2},
    "remediation-values": {"ConfigMap": 2, "DaemonSet": 1, "Service": 3, "Deployment": 1, "Secret": 1,
                           "ServiceAccount": 1, "ClusterRole": 1, "ClusterRoleBinding": 1},
}


# ----- the chart's own files -----------------------------------------------------------------------
def test_default_image_is_the_one_the_containerfile_builds() -> None:
    """`helm template` with default values names the image scripts/build-image.sh tags (test_container_image.py
    checks that side): the release's, by the chart's appVersion."""
    objects = rendered(None)
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert app_version == __version__
    for component in ("agent", "rules"):
        assert container_of(objects, component)["image"] == f"ghcr.io/gpumond/gpumond:{__version__}"
    digest = "sha256:" + "0123456789abcdef" * 4
    pinned = render({"image": {"digest": digest}})
    for component in ("agent", "rules"):
        assert container_of(pinned, component)["image"] == f"ghcr.io/gpumond/gpumond:{__version__}@{digest}"
    with pytest.raises(helm_python.HelmValuesError) as err:  # a tag where the digest goes is refused
        render({"image": {"digest": __version__}})
    assert "at '/image/digest'" in str(err.value)


def test_every_values_file_is_covered() -> None:
    assert sorted(VALUE_IDS) == sorted(EXPECTED_KINDS), "add the new ci/*-values.yaml to EXPECTED_KINDS"


def test_prometheus_rules_copy_is_in_step() -> None:
    """The chart carries a copy (a symlink would not survive `helm package`): it must equal the original."""
    original = REPO_ROOT / "deploy" / "prometheus" / "gpumond.rules.yml"
    copied = CHART / "files" / "gpumond.rules.yml"
    assert copied.read_bytes() == original.read_bytes(), (
        f"cp {original.relative_to(REPO_ROOT)} {copied.relative_to(REPO_ROOT)}")


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=VALUE_IDS)
def test_lint_is_clean(values_file: str | None) -> None:
    report = helm_python.lint(CHART, values_of(values_file), strict=True, namespace="gpu", kube_version="v1.28.0")
    findings = [m for m in report["messages"] if m["severity"] >= 2]  # 1 = info ("icon is recommended")
    assert report["errors"] == [] and findings == [], report


# ----- what a cluster would accept -----------------------------------------------------------------
@pytest.mark.parametrize("values_file", VALUES_FILES, ids=VALUE_IDS)
def test_renders_the_expected_objects_and_each_validates(values_file: str | None) -> None:
    objects = rendered(values_file)
    assert kinds(objects) == EXPECTED_KINDS["defaults" if values_file is None else Path(values_file).stem]
    problems = [p for obj in objects for p in validation_problems(obj)]
    assert problems == []


def test_validation_is_not_vacuous() -> None:
    """A misspelt field is caught in a built-in kind and in a Prometheus Operator kind."""
    ds = copy.deepcopy(one(rendered(None), "DaemonSet"))
    ds["spec"]["template"]["spec"]["hostPid"] = True
    assert any("hostPid" in p for p in validation_problems(ds))
    sm = copy.deepcopy(one(rendered("ci/monitors-values.yaml"), "ServiceMonitor", f"{RELEASE}-gpumond-agent"))
    sm["spec"]["endpoints"][0]["honorlabels"] = True
    sm["spec"]["endpoints"][0]["interval"] = "15"
    found = crd_problems(sm)
    assert any("honorlabels" in p for p in found) and any("'15'" in p for p in found), found


def test_monitors_select_real_ports_and_keep_labels() -> None:
    """Each ServiceMonitor / PodMonitor selects the chart's Service / pods by a port name they have."""
    for values_file, kind in (("ci/monitors-values.yaml", "ServiceMonitor"), ("ci/gpu-operator-values.yaml",
                                                                              "PodMonitor")):
        objects = rendered(values_file)
        for component in ("agent", "rules"):
            monitor = one(objects, kind, f"{RELEASE}-gpumond-{component}")
            selector = monitor["spec"]["selector"]["matchLabels"]
            endpoints = monitor["spec"]["endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"]
            if kind == "ServiceMonitor":
                target = one(objects, "Service", f"{RELEASE}-gpumond-{component}")
                labels, ports = target["metadata"]["labels"], [p["name"] for p in target["spec"]["ports"]]
            else:
                template = workload(objects, component)["spec"]["template"]
                labels = template["metadata"]["labels"]
                ports = [p["name"] for p in template["spec"]["containers"][0]["ports"]]
            assert selector.items() <= labels.items()
            for endpoint in endpoints:
                # agent: its pod / training job labels kept; rules: its training job to exported_job (dashboards)
                assert endpoint["port"] in ports and endpoint["honorLabels"] is (component == "agent")
                assert {"action": "replace", "targetLabel": "job",
                        "replacement": f"gpumond-{component}"} in endpoint["relabelings"]


def test_prometheus_rule_carries_the_shipped_rules_and_promtool_accepts_them(tmp_path: Path) -> None:
    rule = one(rendered("ci/monitors-values.yaml"), "PrometheusRule")
    shipped = yaml.safe_load((REPO_ROOT / "deploy" / "prometheus" / "gpumond.rules.yml").read_text())
    assert rule["spec"] == shipped
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rule["spec"]))
    result = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yml")], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_packaged_chart_still_carries_the_rules_and_dashboards(tmp_path: Path) -> None:
    """`helm package` keeps files/ (the PrometheusRule's and dashboards' source); the archive renders the same."""
    archive = Path(helm_python.package(CHART, destination=tmp_path))
    chart = helm_python.Chart.load_archive(archive.read_bytes())
    objects = render_chart(chart, "ci/monitors-values.yaml")
    assert one(objects, "PrometheusRule")["spec"] == one(rendered("ci/monitors-values.yaml"), "PrometheusRule")["spec"]
    assert _dashboards(objects) == _dashboards(rendered("ci/monitors-values.yaml")) != {}


# ----- Grafana dashboards ----------------------------------------------------------------------------
DASHBOARDS = REPO_ROOT / "dashboards" / "provisioning" / "dashboards" / "gpumond"
CONFIGMAP_LIMIT = 1024 * 1024  # bytes of data a ConfigMap may hold (the API server refuses more)
LAST_APPLIED_LIMIT = 256 * 1024  # `kubectl apply` (client-side) copies an object into a 256 KiB annotation


def _dashboards(objects: tuple[dict[str, Any], ...] | list[dict[str, Any]],
                label: tuple[str, str] = ("grafana_dashboard", "1")) -> dict[str, dict[str, Any]]:
    """The dashboard ConfigMaps Grafana's sidecar would pick up (by its label), by name."""
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"
            and o["metadata"].get("labels", {}).get(label[0]) == label[1]}


def test_dashboards_copy_is_in_step() -> None:
    """The chart carries a copy of the built JSON (`python -m dashboards.build` writes and checks both)."""
    originals = sorted(DASHBOARDS.glob("*.json"))
    copies = sorted((CHART / "files" / "dashboards").glob("*.json"))
    assert [p.name for p in copies] == [p.name for p in originals] != []
    for original, copied in zip(originals, copies):
        assert copied.read_bytes() == original.read_bytes(), "python -m dashboards.build"


def test_dashboards_are_off_by_default() -> None:
    assert _dashboards(rendered(None)) == {}


def test_dashboard_configmaps_hold_exactly_the_dashboards() -> None:
    """One ConfigMap per dashboard, for the sidecar, holding the built JSON byte for byte, under the limits."""
    maps = _dashboards(rendered("ci/monitors-values.yaml"))
    assert sorted(maps) == [f"{RELEASE}-gpumond-dashboard-{n}" for n in ("fleet", "job", "node")]
    held = {}
    for name, cm in maps.items():
        assert cm["metadata"]["namespace"] == NAMESPACE
        assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU fleet (gpumond)"}
        assert list(cm["data"]) == [f"gpumond-{name.rsplit('-', 1)[1]}.json"]
        held.update(cm["data"])
        data_bytes = sum(len(k.encode()) + len(v.encode()) for k, v in cm["data"].items())
        assert data_bytes < CONFIGMAP_LIMIT
        assert len(json.dumps(cm).encode()) < LAST_APPLIED_LIMIT, f"{name}: too big for client-side apply"
    assert held == {p.name: p.read_text(encoding="utf-8") for p in DASHBOARDS.glob("*.json")}
    assert {json.loads(text)["uid"] for text in held.values()} == {"gpumond-fleet", "gpumond-node", "gpumond-job"}


def test_dashboard_label_namespace_and_folder_follow_the_values() -> None:
    values = {"monitoring": {"dashboards": {
        "enabled": True, "label": "example.com/dashboard", "labelValue": "gpu", "namespace": "monitoring",
        "folder": "GPUs", "folderAnnotation": "example.com/folder", "labels": {"team": "ml"},
        "annotations": {"owner": "sre"}}}}
    objects = render(values)
    assert _dashboards(objects) == {}  # not the default label any more
    maps = _dashboards(objects, ("example.com/dashboard", "gpu"))
    assert len(maps) == 3
    for cm in maps.values():
        meta = cm["metadata"]
        assert meta["namespace"] == "monitoring" and meta["labels"]["team"] == "ml"
        assert meta["annotations"] == {"owner": "sre", "example.com/folder": "GPUs"}
        assert validation_problems(cm) == []
    no_folder = _dashboards(render({"monitoring": {"dashboards": {"enabled": True}}}))
    assert len(no_folder) == 3 and all("annotations" not in cm["metadata"] for cm in no_folder.values())
    assert {cm["metadata"]["namespace"] for cm in no_folder.values()} == {NAMESPACE}


# ----- security --------------------------------------------------------------------------------------
def test_agent_security_by_mode() -> None:
    """Default: only SYS_ADMIN, as root. Read-only: nothing the Pod Security "restricted" level forbids."""
    default = workload(rendered(None), "agent")["spec"]["template"]["spec"]
    sc = default["containers"][0]["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]} and sc["readOnlyRootFilesystem"] is True
    assert default["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert default["hostPID"] is False and default["automountServiceAccountToken"] is False
    mounts = {m["name"]: m for m in default["containers"][0]["volumeMounts"]}
    assert mounts["pod-resources"] == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources",
                                       "readOnly": True}
    assert sorted(pod_security_violations(default)) == sorted([
        "baseline: agent adds SYS_ADMIN", "baseline: hostPath volume pod-resources", "baseline: hostPath volume state",
        "restricted: agent adds SYS_ADMIN", "restricted: agent allowPrivilegeEscalation not false",
        "restricted: agent runAsNonRoot not true", "restricted: agent runAsUser 0"])
    read_only = workload(rendered("ci/readonly-values.yaml"), "agent")["spec"]["template"]["spec"]
    assert pod_security_violations(read_only) == []
    assert config_of(rendered("ci/readonly-values.yaml"), "agent")["policy"]["mode"] == "dry_run"


def test_the_policy_is_dry_run_unless_enforce_is_written() -> None:
    """A chart installed across a fleet changes no power limit until the operator writes one line."""
    for values_file in VALUES_FILES:
        assert config_of(rendered(values_file), "agent")["policy"]["mode"] == "dry_run", values_file
    assert "policy dry_run: no power limit is changed; --set agent.config.policy.mode=enforce" in notes({})
    enforcing = {"agent": {"config": {"policy": {"mode": "enforce"}}}}
    assert config_of(tuple(render(enforcing)), "agent")["policy"]["mode"] == "enforce"
    assert "CAP_SYS_ADMIN, policy enforce):" in notes(enforcing)


def test_committed_values_schema_embeds_the_generated_config_schemas() -> None:
    from gpumond.config.json_schema import render as render_schema

    committed = (CHART / "values.schema.json").read_text(encoding="utf-8")
    assert committed == render_schema(json.loads(committed)), (
        "regenerate: python -m gpumond.config.json_schema deploy/helm/gpumond/values.schema.json")
    assert "baseline: hostPID" in pod_security_violations(
        workload(rendered("ci/gpu-operator-values.yaml"), "agent")["spec"]["template"]["spec"])


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=VALUE_IDS)
def test_rules_service_meets_restricted(values_file: str | None) -> None:
    assert pod_security_violations(workload(rendered(values_file), "rules")["spec"]["template"]["spec"]) == []


# ----- values the schema or the templates refuse -------------------------------------------------------
@pytest.mark.parametrize(("values", "message"), [
    ({"agent": {"port": 70000}}, "at '/agent/port': maximum: got 70,000, want 65,535"),
    ({"agent": {"readOnly": "yes"}}, "at '/agent/readOnly': got string, want boolean"),
    ({"agnet": {"readOnly": True}}, "additional properties 'agnet' not allowed"),
    ({"agent": {"config": {"policy": {"mode": "enforced"}}}},
     "at '/agent/config/policy/mode': value must be one of 'enforce', 'dry_run', 'off'"),
    ({"secret": {"rulesTokens": ["short"]}}, "at '/secret/rulesTokens/0': 'short' does not match pattern"),
    ({"secret": {"pagerdutyRoutingKey": "not-a-key"}}, "at '/secret/pagerdutyRoutingKey'"),
    ({"rules": {"replicas": 0}}, "at '/rules/replicas': minimum: got 0, want 1"),
    ({"monitoring": {"serviceMonitor": {"enabled": True, "interval": "15"}}},
     "at '/monitoring/serviceMonitor/interval': '15' does not match pattern"),
    ({"monitoring": {"dashboards": {"label": "grafana dashboard"}}},
     "at '/monitoring/dashboards/label': 'grafana dashboard' does not match pattern"),
    ({"monitoring": {"dashboards": {"labelValue": 1}}},
     "at '/monitoring/dashboards/labelValue': got number, want string"),
    ({"monitoring": {"dashboards": {"namespace": "Monitoring"}}},
     "at '/monitoring/dashboards/namespace': 'Monitoring' does not match pattern"),
    # Inside the embedded daemon configs (the schema generated from gpumond's config models):
    ({"agent": {"config": {"sampling": {"fast_intervall_s": 2}}}},
     "at '/agent/config/sampling': additional properties 'fast_intervall_s' not allowed"),
    ({"agent": {"config": {"sampling": {"fast_interval_s": "1s"}}}},
     "at '/agent/config/sampling/fast_interval_s': got string, want number"),
    ({"agent": {"config": {"policy": {"thermal": {"margin_c": 50}}}}},
     "at '/agent/config/policy/thermal/margin_c': maximum: got 50, want 40"),
    ({"agent": {"config": {"policy": {"power_limit": {"default_w": "80 %"}}}}},
     "at '/agent/config/policy/power_limit/default_w'"),
    ({"rules": {"config": {"evaluation_intervall_s": 2}}},
     "at '/rules/config': additional properties 'evaluation_intervall_s' not allowed"),
    ({"rules": {"config": {"alerting": {"slack": {"webhook_url_fil": "/x"}}}}},
     "at '/rules/config/alerting/slack': additional properties 'webhook_url_fil' not allowed"),
], ids=["port", "bool", "typo", "policy-mode", "token", "routing-key", "replicas", "interval", "dashboard-label",
        "dashboard-label-value", "dashboard-namespace", "agent-config-typo", "agent-config-type",
        "agent-config-bound", "agent-config-power", "rules-config-typo", "rules-config-nested-typo"])
def test_schema_rejects_bad_values(values: dict[str, Any], message: str) -> None:
    chart = helm_python.Chart.load(CHART)
    with pytest.raises(helm_python.HelmValuesError) as err:
        chart.validate_schema(values)
    assert message in str(err.value)
    with pytest.raises(helm_python.HelmValuesError):  # `helm install` / `helm template` refuse them too
        render(values)


@pytest.mark.parametrize(("values", "message"), [
    ({"agent": {"readOnly": True, "config": {"policy": {"mode": "enforce"}}}},
     "agent.config.policy.mode: enforce needs CAP_SYS_ADMIN, which agent.readOnly: true drops"),
    ({"rules": {"replicas": 3}}, "rules.replicas: more than 1 needs rules.sharded: true"),
    ({"agent": {"config": {"listen": "0.0.0.0:1"}}}, "agent.config.listen: set by the chart"),
    ({"rules": {"config": {"tokens": ["0123456789abcdef"]}}}, "rules.config.tokens: set by the chart"),
    ({"monitoring": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}},
     "monitoring: enable serviceMonitor or podMonitor, not both"),
    ({"monitoring": {"dashboards": {"enabled": True, "labels": {"grafana_dashboard": "0"}}}},
     "monitoring.dashboards.labels: grafana_dashboard is set by monitoring.dashboards.label / labelValue"),
    ({"tls": {"enabled": True, "rulesSecret": "r"}}, "tls.agentSecret: name the Secret with the agent's certificate"),
    ({"tls": {"enabled": True, "agentSecret": "a", "rulesSecret": "r", "clientAuthType": "RequireAndVerifyClientCert"},
      "monitoring": {"podMonitor": {"enabled": True}}},
     "monitoring.tlsConfig: tls.clientAuthType RequireAndVerifyClientCert refuses a Prometheus without a client "
     "certificate"),
    ({"tls": {"enabled": True, "agentSecret": "a", "rulesSecret": "r"},
      "rules": {"config": {"web_config_file": "/x.yml"}}}, "rules.config.web_config_file: set by the chart"),
], ids=["readonly-enforce", "unsharded-replicas", "agent-listen", "rules-tokens", "both-monitors",
        "dashboard-label-twice", "tls-no-secret", "mtls-monitor-without-cert", "tls-web-config-twice"])
def test_contradictory_values_fail_with_one_line(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmRenderError) as err:
        render(values)
    assert message in str(err.value) and "\n" not in str(err.value).strip()


# ----- what gpumond makes of it ------------------------------------------------------------------------------
@pytest.mark.parametrize("values_file", VALUES_FILES, ids=VALUE_IDS)
def test_rendered_configs_pass_check_config(values_file: str | None, tmp_path: Path) -> None:
    objects = rendered(values_file)
    existing = EXISTING_SECRET if values_of(values_file).get("secret", {}).get("existingSecret") else None
    for component in ("agent", "rules"):
        result = check_config(objects, component, tmp_path, existing)
        assert result.returncode == 0, f"{component}: {result.stderr}"
        assert f"ok ({component} config" in result.stdout


def test_check_config_catches_a_bad_inner_config(tmp_path: Path) -> None:
    """What the values schema cannot say (one bound against another) gpumond's own validator refuses."""
    objects = tuple(render({"agent": {"config": {"sampling": {"fast_interval_s": 5, "slow_interval_s": 2}}}}))
    result = check_config(objects, "agent", tmp_path, None)
    assert result.returncode == 2 and "sampling.slow_interval_s: must be at least fast_interval_s" in result.stderr


def test_existing_secret_without_its_keys_is_one_line(tmp_path: Path) -> None:
    """An existing Secret without the Slack key that rules.config asks for: the service says which is missing."""
    objects = rendered("ci/existing-secret-values.yaml")
    partial = {"rules-tokens": EXISTING_SECRET["rules-tokens"]}
    result = check_config(objects, "rules", tmp_path, partial)
    assert result.returncode == 2 and "GPUMOND_SLACK_WEBHOOK_URL" in result.stderr


def _probe_paths(container: dict[str, Any]) -> dict[str, str]:
    return {k: container[k]["httpGet"]["path"] for k in ("startupProbe", "livenessProbe", "readinessProbe")
            if k in container}


def test_agent_container_serves_its_probes(tmp_path: Path) -> None:
    """The agent started with the DaemonSet's command and args (on 2 simulated GPUs) answers every probe 200."""
    objects = rendered(None)
    proc, port, info = run_rendered(objects, "agent", tmp_path, {"NODE_NAME": "gpu-node-7"}, ["--sim", "2"])
    container = info["container"]
    assert container["ports"][0] == {"name": "metrics", "containerPort": info["listen_port"], "protocol": "TCP"}
    service = one(objects, "Service", f"{RELEASE}-gpumond-agent")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    probes = _probe_paths(container)
    assert {container[k]["httpGet"]["port"] for k in probes} == {"metrics"}
    with proc:
        proc.spawn()
        base = f"http://{LOOPBACK}:{port}"
        for kind, path in probes.items():
            wait_until(lambda p=path: http_get(base + p, timeout=1.0)[0] == 200, timeout=30,
                       what=f"agent {kind} GET {path} to answer 200", describe=proc.describe)
        status, _, body = http_get(base + "/metrics")
        assert status == 200 and b'hostname="gpu-node-7"' in body  # --node-name=$(NODE_NAME) took effect


def test_sharded_rules_container_serves_its_probes(tmp_path: Path) -> None:
    """Pod 2 of the sharded StatefulSet: --shard=$(SHARD_INDEX)/4 from its pod-index label, probes answered."""
    objects = rendered("ci/sharded-values.yaml")
    container = container_of(objects, "rules")
    index_env = next(e for e in container["env"] if e["name"] == "SHARD_INDEX")
    assert index_env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    # Telemetry from a Prometheus that is not there: readiness ("can accept pushes") stays 200 and says so.
    proc, port, info = run_rendered(objects, "rules", tmp_path, {"SHARD_INDEX": "2"}, [])
    probes = _probe_paths(info["container"])
    assert probes == {"livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    with proc:
        proc.spawn()
        base = f"http://{LOOPBACK}:{port}"
        wait_until(lambda: http_get(base + "/healthz", timeout=1.0)[0] == 200, timeout=30,
                   what="rules GET /healthz to answer 200", describe=proc.describe)
        wait_until(lambda: (r := http_get(base + "/readyz", timeout=1.0))[0] == 200 and b"failing" in r[2],
                   timeout=30, what="rules GET /readyz to answer 200 saying telemetry is failing",
                   describe=proc.describe)
        wait_until(lambda: "shard=2/4" in proc.stderr() + proc.stdout(), timeout=10,
                   what="the start line to name shard 2/4", describe=proc.describe)


def test_rules_container_is_ready_with_defaults(tmp_path: Path) -> None:
    objects = rendered(None)
    proc, port, info = run_rendered(objects, "rules", tmp_path, {}, [])
    assert info["container"]["ports"][0]["containerPort"] == info["listen_port"]
    with proc:
        proc.spawn()
        for path in _probe_paths(info["container"]).values():
            wait_until(lambda p=path: http_get(f"http://{LOOPBACK}:{port}{p}", timeout=1.0)[0] == 200, timeout=30,
                       what=f"rules GET {path} to answer 200", describe=proc.describe)


def test_notes_tell_how_to_reach_a_shard() -> None:
    text = notes(values_of("ci/sharded-values.yaml"))
    assert f"GPUMOND_ENDPOINT='http://{RELEASE}-gpumond-rules-{{shard}}.{RELEASE}-gpumond-rules-shards.gpu.svc:9481'" \
        in text
    assert "GPUMOND_SHARDS=4\n" in text
    assert "no GPU telemetry source" in notes({})


def test_notes_tell_where_the_dashboards_are() -> None:
    text = notes(values_of("ci/monitors-values.yaml"))
    assert f"ConfigMaps {RELEASE}-gpumond-dashboard-{{fleet,node,job}}" in text
    assert f"kubectl -n {NAMESPACE} get configmaps -l grafana_dashboard=1" in text
    assert 'Grafana folder "GPU fleet (gpumond)"' in text
    assert "kubectl -n monitoring get configmaps" in notes({"monitoring": {"dashboards": {"enabled": True,
                                                                                          "namespace": "monitoring"}}})
    assert "Grafana dashboards" not in notes({})


# ----- TLS ------------------------------------------------------------------------------------------------------
def test_tls_mounts_the_cert_manager_secret_where_the_rendered_web_config_reads_it(tmp_path: Path) -> None:
    """ci/tls-values.yaml: each daemon's web.yml, with the files its Secret volume would hold, loads in gpumond;
    the monitors scrape https with the component's CA; probes over mTLS are TCP checks."""
    from gpumond.web import load_web
    from tests.pki import CA

    objects = rendered("ci/tls-values.yaml")
    for component, secret in (("agent", "gpumond-agent-tls"), ("rules", "gpumond-rules-tls")):
        pod = workload(objects, component)["spec"]["template"]["spec"]
        assert {"name": "tls", "secret": {"secretName": secret}} in pod["volumes"]
        mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "tls")
        assert config_of(objects, component)["web_config_file"] == "/etc/gpumond/web.yml"
        web_yml = _configmap_data(objects, component)["web.yml"]
        # the Secret's files, as cert-manager writes them, where the volume would put them
        ca = CA(tmp_path / component, "ca")
        issued = ca.issue("tls")
        files = {"tls.crt": issued.cert, "tls.key": issued.key, "ca.crt": ca.path}
        for name, path in files.items():
            web_yml = web_yml.replace(f"{mount['mountPath']}/{name}", str(path))
        (tmp_path / f"{component}-web.yml").write_text(web_yml)
        web = load_web(tmp_path / f"{component}-web.yml")
        assert web.tls is not None and web.tls.settings.client_auth_type == "RequireAndVerifyClientCert"
        probes = [pod["containers"][0][k] for k in ("livenessProbe", "readinessProbe")]
        assert all("tcpSocket" in p and "httpGet" not in p for p in probes)
    for monitor in (o for o in objects if o["kind"] == "ServiceMonitor"):
        endpoint = monitor["spec"]["endpoints"][0]
        component = monitor["metadata"]["name"].rsplit("-", 1)[1]
        assert endpoint["scheme"] == "https"
        assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": f"gpumond-{component}-tls", "key": "ca.crt"}}
        assert endpoint["tlsConfig"]["serverName"] == monitor["metadata"]["name"]
        assert endpoint["tlsConfig"]["keySecret"] == {"name": "prometheus-gpumond-client", "key": "tls.key"}


def test_tls_without_client_certificates_keeps_http_probes_over_https() -> None:
    objects = render({"tls": {"enabled": True, "agentSecret": "a", "rulesSecret": "r"}})
    probe = container_of(tuple(objects), "agent")["readinessProbe"]
    assert probe["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": "HTTPS"}
    assert "client_ca_file" not in _configmap_data(tuple(objects), "agent")["web.yml"]


def _configmap_data(objects: tuple[dict[str, Any], ...], component: str) -> dict[str, str]:
    return one(objects, "ConfigMap", f"{RELEASE}-gpumond-{component}")["data"]
