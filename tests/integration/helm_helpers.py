"""The Helm chart as the real Helm engine renders it, and the checks a cluster would make of the result.

Rendering and linting use helm-python-sdk, which bundles the Helm v4 SDK as a shared library (no helm binary
is packaged for Debian or PyPI). Built-in kinds are validated with kubernetes-validate against the
Kubernetes OpenAPI schemas. The Prometheus Operator kinds (ServiceMonitor, PodMonitor, PrometheusRule) have no
schema there, so `crd_problems` checks them structurally, see its docstring.

    manifests = render("ci/sharded-values.yaml")           # [{kind, metadata, ...}, ...] without NOTES.txt
    kinds(manifests)                                       # {"StatefulSet": 1, "Service": 3, ...}
    for obj in manifests: assert not validation_problems(obj)
"""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import yaml

from tests.integration.helpers import LOOPBACK, REPO_ROOT, ManagedProcess, free_port

CHART = REPO_ROOT / "deploy" / "helm" / "gpumond"
RELEASE, NAMESPACE = "gm", "gpu"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest kubernetes-validate knows.
KUBE_VERSIONS = ("1.28", kubernetes_validate.utils.latest_version())
CRD_GROUP = "monitoring.coreos.com/v1"


# Stand-ins for the keys of a Secret the chart does not create (secret.existingSecret).
EXISTING_SECRET = {"rules-tokens": "0123456789abcdef0123456789abcdef,fedcba9876543210fedcba9876543210",
                   "slack-webhook-url": "https://hooks.slack.com/services/T000/B000/XXXX",
                   "pagerduty-routing-key": "0123456789abcdef0123456789abcdef"}


def values_of(values_file: str | None) -> dict[str, Any]:
    """The values in `values_file` (relative to the chart), or {} for the chart's defaults."""
    return {} if values_file is None else yaml.safe_load((CHART / values_file).read_text()) or {}


def render(values: str | Mapping[str, Any] | None = None, chart: Path = CHART, *, release: str = RELEASE,
           namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """Every object the chart renders with these values (a values file name or a dict), NOTES.txt left out."""
    return render_chart(helm_python.Chart.load(chart), values, release=release, namespace=namespace)


def render_chart(chart: helm_python.Chart, values: str | Mapping[str, Any] | None, *, release: str = RELEASE,
                 namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """Like `render`, for an already loaded chart (e.g. a packaged archive)."""
    vals = values_of(values) if isinstance(values, str) or values is None else dict(values)
    out = chart.render(vals, name=release, namespace=namespace)
    return [doc for path, text in sorted(out.items()) if not path.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text) if doc]


@cache
def rendered(values_file: str | None) -> tuple[dict[str, Any], ...]:
    """`render(values_file)`, computed once per test session (callers must not mutate the objects)."""
    return tuple(render(values_file))


def notes(values: Mapping[str, Any]) -> str:
    """The NOTES.txt the operator sees after `helm install`."""
    out = helm_python.Chart.load(CHART).render(dict(values), name=RELEASE, namespace=NAMESPACE)
    return next(text for path, text in out.items() if path.endswith("NOTES.txt"))


def kinds(objects: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many objects of each kind."""
    return dict(Counter(o["kind"] for o in objects))


def one(objects: Iterable[Mapping[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The single object of `kind` (and `name`); fails naming what there was."""
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return dict(found[0])


def _configmap(objects: Iterable[Mapping[str, Any]], component: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith(f"-{component}"))


def config_of(objects: Iterable[Mapping[str, Any]], component: str) -> dict[str, Any]:
    """The parsed agent.yaml / rules.yaml in a component's ConfigMap."""
    return yaml.safe_load(_configmap(objects, component)["data"][f"{component}.yaml"])


def check_config(objects: tuple[dict[str, Any], ...], component: str, tmp_path: Path,
                 existing: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
    """`gpumond check-config` on a rendered agent.yaml / rules.yaml, with the environment its Secret gives."""
    path = tmp_path / f"{component}.yaml"
    data = _configmap(objects, component)["data"]
    text = data[f"{component}.yaml"]
    if "web.yml" in data or "/etc/gpumond-tls/" in text:
        # The chart mounts the TLS Secret at /etc/gpumond-tls: the web config and any client tls_config read its files,
        # which are made here (tests/pki.py) as the kubelet would mount them.
        from tests.pki import CA

        ca = CA(tmp_path / f"{component}-tls", "ca")
        issued = ca.issue("tls")
        mounted = {"tls.crt": issued.cert, "tls.key": issued.key, "ca.crt": ca.path}

        def mount(body: str) -> str:
            for name, made in mounted.items():
                body = body.replace(f"/etc/gpumond-tls/{name}", str(made))
            return body

        text = mount(text)
        if "web.yml" in data:
            (tmp_path / f"{component}-web.yml").write_text(mount(data["web.yml"]))
            text = text.replace("/etc/gpumond/web.yml", str(tmp_path / f"{component}-web.yml"))
    path.write_text(text)
    container = next(o for o in objects if o["kind"] in ("DaemonSet", "Deployment", "StatefulSet")
                     and o["metadata"]["name"].endswith(f"-{component}"))["spec"]["template"]["spec"]["containers"][0]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), **secret_env(objects, container, existing)}
    return subprocess.run([sys.executable, "-m", "gpumond.cli", "check-config", "--kind", component, str(path)],
                          capture_output=True, text=True, timeout=60, env=env, check=False)


def secret_env(objects: Iterable[Mapping[str, Any]], container: Mapping[str, Any],
               existing: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a container gets from secretKeyRefs, resolved as the kubelet would.

    Data comes from the rendered Secret, or from `existing` (key -> value) standing in for an existing Secret.
    An optional key that is absent is left out, as the kubelet leaves it out.
    """
    data = dict(existing or {})
    for s in objects:
        if s["kind"] == "Secret":
            data.update({k: base64.b64decode(v).decode() for k, v in s.get("data", {}).items()})
    env = {}
    for var in container.get("env", []):
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref is None:
            continue
        if ref["key"] in data:
            env[var["name"]] = data[ref["key"]]
        else:
            assert ref.get("optional"), f"{var['name']}: required key {ref['key']} is in no Secret"
    return env


def expand_args(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """command + args with $(VAR) expanded the way the kubelet does (unknown variables left as written)."""
    def sub(text: str) -> str:
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)

    return [sub(a) for a in [*container.get("command", []), *container.get("args", [])]]


# ----- running what was rendered ------------------------------------------------------------------
def workload(objects: tuple[dict[str, Any], ...], component: str) -> dict[str, Any]:
    """The DaemonSet, Deployment or StatefulSet of a component."""
    return next(o for o in objects if o["kind"] in ("DaemonSet", "Deployment", "StatefulSet")
                and o["metadata"]["name"] == f"{RELEASE}-gpumond-{component}")


def container_of(objects: tuple[dict[str, Any], ...], component: str) -> dict[str, Any]:
    """Its (only) container."""
    return workload(objects, component)["spec"]["template"]["spec"]["containers"][0]


def mounted_secret_files(objects: tuple[dict[str, Any], ...], component: str, into: Path) -> dict[str, Path]:
    """The component's Secret volumes with `items`, written under `into` as the kubelet would mount them (from the
    rendered Secret): {mount path in the pod: the local directory holding the same files}."""
    pod = workload(objects, component)["spec"]["template"]["spec"]
    data = {k: base64.b64decode(v).decode() for s in objects if s["kind"] == "Secret"
            for k, v in s.get("data", {}).items()}
    volumes = {v["name"]: v["secret"] for v in pod.get("volumes", []) if "secret" in v and "items" in v["secret"]}
    out = {}
    for mount in pod["containers"][0].get("volumeMounts", []):
        if mount["name"] in volumes:
            local = into / mount["name"]
            local.mkdir(parents=True)
            for item in volumes[mount["name"]]["items"]:
                (local / item["path"]).write_text(data[item["key"]])
            out[mount["mountPath"]] = local
    return out


def run_rendered(objects: tuple[dict[str, Any], ...], component: str, tmp_path: Path, env: dict[str, str],
                 extra: list[str], *, relay_upstream: str | None = None) -> tuple[ManagedProcess, int, dict[str, Any]]:
    """The component's container as rendered (command, args, config, secrets), on loopback instead of 0.0.0.0.

    The config's state_dir moves into tmp_path (it is a volume in the pod), cluster URLs (Prometheus,
    Alertmanager, the relay's upstream unless `relay_upstream` names one) to a closed loopback port and the
    relay's pod address to a free loopback port, since tests talk to 127.0.0.1 only; files the config reads from
    a mounted Secret are written as mounted (`mounted_secret_files`); the rest runs as written.
    """
    container = container_of(objects, component)
    config = config_of(objects, component)
    listen_port = int(config["listen"].rsplit(":", 1)[1])
    config["state_dir"] = str(tmp_path / "state")
    nowhere = f"http://{LOOPBACK}:{free_port()}"
    if (config.get("telemetry") or {}).get("prometheus"):
        config["telemetry"]["prometheus"]["url"] = nowhere
    if ((config.get("alerting") or {}).get("alertmanager") or {}).get("urls"):
        config["alerting"]["alertmanager"]["urls"] = [nowhere]
    if (config.get("relay") or {}).get("upstream"):
        config["relay"] = {**config["relay"], "upstream": relay_upstream or nowhere, "shards": None}
    (tmp_path / "state").mkdir()
    config_path = tmp_path / f"{component}.yaml"
    text = yaml.safe_dump(config)
    for mount_path, local in mounted_secret_files(objects, component, tmp_path / "mounts").items():
        text = text.replace(mount_path + "/", f"{local}/")
    config_path.write_text(text)
    argv = expand_args(container, env)
    assert argv[:2] == ["gpumond", component] and f"--config=/etc/gpumond/{component}.yaml" in argv
    # The pod's own address (the relay's) becomes a free loopback port: one machine runs many of these.
    relay = f"{LOOPBACK}:{free_port()}"
    moved = {"--config=": f"--config={config_path}", "--relay-listen=": f"--relay-listen={relay}"}
    argv = [sys.executable, "-m", "gpumond.cli",
            *[next((v for k, v in moved.items() if a.startswith(k)), a) for a in argv[1:]]]
    port = free_port()
    proc = ManagedProcess([*argv, *extra, "--listen", f"{LOOPBACK}:{port}"], tmp_path / "run",
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1",
                               **secret_env(objects, container), **env})
    return proc, port, {"container": container, "listen_port": listen_port, "relay": relay}


# ----- validation -----------------------------------------------------------------------------
def validation_problems(obj: Mapping[str, Any]) -> list[str]:
    """Why a cluster would refuse `obj`: kubernetes-validate (strict) for built-in kinds, else crd_problems."""
    if obj["apiVersion"] == CRD_GROUP:
        return crd_problems(obj)
    problems = []
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(dict(obj), version, strict=True)
        except kubernetes_validate.ValidationError as err:
            problems.append(f"{obj['kind']} {obj['metadata']['name']} (Kubernetes {version}): {err.message} "
                            f"at {'/'.join(map(str, err.path))}")
    return problems


# The Prometheus Operator's Duration and the relabel actions of its API (monitoring.coreos.com/v1).
_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
_RELABEL_ACTIONS = ["replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep", "lowercase",
                    "uppercase", "keepequal", "dropequal"]
_LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"


def _closed(properties: dict[str, Any], required: Iterable[str] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = _closed({"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
                     "namespace": {"type": "string"}, "labels": _STR_MAP, "annotations": _STR_MAP},
                    ["name", "namespace"])
_RELABELING = _closed({"action": {"enum": _RELABEL_ACTIONS}, "sourceLabels": {"type": "array", "items": {
    "type": "string", "pattern": _LABEL_NAME}}, "targetLabel": {"type": "string", "pattern": _LABEL_NAME},
    "replacement": {"type": "string"}, "regex": {"type": "string"}, "separator": {"type": "string"},
    "modulus": {"type": "integer"}})
_KEY_SELECTOR = _closed({"name": {"type": "string", "minLength": 1}, "key": {"type": "string", "minLength": 1}},
                        ["name", "key"])
_SECRET_OR_CONFIGMAP = _closed({"secret": _KEY_SELECTOR, "configMap": _KEY_SELECTOR})
# The operator's SafeTLSConfig (a PodMonitor's; a ServiceMonitor's tlsConfig extends it with file paths).
_TLS_CONFIG = _closed({"ca": _SECRET_OR_CONFIGMAP, "cert": _SECRET_OR_CONFIGMAP, "keySecret": _KEY_SELECTOR,
                       "serverName": {"type": "string"}, "insecureSkipVerify": {"type": "boolean"}})
_ENDPOINT = _closed({"port": {"type": "string", "minLength": 1}, "path": {"type": "string", "pattern": "^/"},
                     "scheme": {"enum": ["http", "https"]}, "tlsConfig": _TLS_CONFIG,
                     "interval": {"type": "string", "pattern": _DURATION},
                     "scrapeTimeout": {"type": "string", "pattern": _DURATION},
                     "honorLabels": {"type": "boolean"}, "relabelings": {"type": "array", "items": _RELABELING}},
                    ["port"])
_SELECTOR = _closed({"matchLabels": _STR_MAP, "matchExpressions": {"type": "array"}})
_NS_SELECTOR = _closed({"matchNames": {"type": "array", "items": {"type": "string"}}, "any": {"type": "boolean"}})
_RULE = _closed({"record": {"type": "string", "pattern": r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"},
                 "alert": {"type": "string", "pattern": _LABEL_NAME},
                 "expr": {"type": ["string", "integer"]}, "for": {"type": "string", "pattern": _DURATION},
                 "keep_firing_for": {"type": "string", "pattern": _DURATION},
                 "labels": _STR_MAP, "annotations": _STR_MAP}, ["expr"])
_RULE["oneOf"] = [{"required": ["record"]}, {"required": ["alert"]}]
CRD_SCHEMAS = {
    "ServiceMonitor": _closed({"selector": _SELECTOR, "namespaceSelector": _NS_SELECTOR, "jobLabel": {"type": "string"},
                               "endpoints": {"type": "array", "items": _ENDPOINT, "minItems": 1}},
                              ["selector", "endpoints"]),
    "PodMonitor": _closed({"selector": _SELECTOR, "namespaceSelector": _NS_SELECTOR, "jobLabel": {"type": "string"},
                           "podMetricsEndpoints": {"type": "array", "items": _ENDPOINT, "minItems": 1}},
                          ["selector", "podMetricsEndpoints"]),
    "PrometheusRule": _closed({"groups": {"type": "array", "minItems": 1, "items": _closed(
        {"name": {"type": "string", "minLength": 1}, "interval": {"type": "string", "pattern": _DURATION},
         "limit": {"type": "integer"}, "rules": {"type": "array", "items": _RULE}}, ["name", "rules"])}},
        ["groups"]),
}


def crd_problems(obj: Mapping[str, Any]) -> list[str]:
    """A structural check of a monitoring.coreos.com/v1 object (the CRD schemas are not bundled anywhere here).

    It is closed over the fields of the Prometheus Operator API that the chart uses: apiVersion, kind and
    metadata as the API server requires; for ServiceMonitor / PodMonitor the selector, namespaceSelector and
    endpoints (port name, path, interval and scrapeTimeout as the operator's Duration pattern, honorLabels,
    relabelings with a known action and valid label names); for PrometheusRule the groups, each rule a
    record or an alert with expr, for, labels, annotations. Any other field, a typo or a wrong type is
    reported. What it does not check: fields the chart never writes, and PromQL (promtool does that).
    """
    kind = obj.get("kind")
    if kind not in CRD_SCHEMAS:
        return [f"{kind}: no structural schema for this kind"]
    top = _closed({"apiVersion": {"const": CRD_GROUP}, "kind": {"const": kind}, "metadata": _METADATA,
                   "spec": CRD_SCHEMAS[kind]}, ["apiVersion", "kind", "metadata", "spec"])
    validator = jsonschema.Draft7Validator(top)
    return [f"{kind} {obj.get('metadata', {}).get('name')}: {e.message} at {'/'.join(map(str, e.absolute_path))}"
            for e in validator.iter_errors(dict(obj))]


# ----- Pod Security Standards -----------------------------------------------------------------------
# The volume types the "restricted" level allows (Kubernetes Pod Security Standards).
_RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}


def pod_security_violations(pod: Mapping[str, Any]) -> list[str]:
    """The controls of the Pod Security Standards "baseline" and "restricted" levels a pod spec breaks.

    Baseline: host namespaces, privileged containers, added capabilities beyond the baseline set, hostPath
    volumes, host ports. Restricted adds: volume types, allowPrivilegeEscalation false, runAsNonRoot (and no
    runAsUser 0), seccomp RuntimeDefault or Localhost, capabilities drop ALL (add at most NET_BIND_SERVICE).
    Each violation names its level, e.g. "baseline: hostPath volume pod-resources".
    """
    out: list[str] = []
    for key in ("hostPID", "hostIPC", "hostNetwork"):
        if pod.get(key):
            out.append(f"baseline: {key}")
    psc = pod.get("securityContext", {})
    for vol in pod.get("volumes", []):
        vtype = next(k for k in vol if k != "name")
        if vtype == "hostPath":
            out.append(f"baseline: hostPath volume {vol['name']}")
        elif vtype not in _RESTRICTED_VOLUMES:
            out.append(f"restricted: volume type {vtype}")
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        sc = c.get("securityContext", {})
        caps = sc.get("capabilities", {})
        if sc.get("privileged"):
            out.append(f"baseline: {c['name']} privileged")
        added = set(caps.get("add", []))
        baseline_caps = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
        for cap in sorted(added - baseline_caps):
            out.append(f"baseline: {c['name']} adds {cap}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"baseline: {c['name']} hostPort")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"restricted: {c['name']} allowPrivilegeEscalation not false")
        if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            out.append(f"restricted: {c['name']} runAsNonRoot not true")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"restricted: {c['name']} runAsUser 0")
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"restricted: {c['name']} seccompProfile {seccomp}")
        if "ALL" not in caps.get("drop", []):
            out.append(f"restricted: {c['name']} does not drop ALL capabilities")
        for cap in sorted(added - {"NET_BIND_SERVICE"}):
            out.append(f"restricted: {c['name']} adds {cap}")
    return out
