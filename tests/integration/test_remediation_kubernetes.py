"""The Kubernetes backend through the official client against a stand-in API server (tests/k8s_apiserver.py):
no API server runs here, so the stand-in speaks the REST protocol for exactly the calls the backend makes and
validates every patched Node against the Kubernetes schema (kubernetes-validate, strict)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from gpumond.config.remediation import KubernetesConfig, RemediationConfig
from gpumond.rules.remediation.backends import BackendError, NotOurs
from gpumond.rules.remediation.backends.kubernetes import ANNOTATION, TAINT_KEY, KubernetesBackend
from gpumond.rules.remediation.remediator import Remediator
from gpumond.rules.types import AgentAlert, GpuSample, TelemetryBatch
from tests.k8s_apiserver import JSON_PATCH, STRATEGIC, FakeApiServer, node

pytestmark = pytest.mark.integration
OTHER_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def _api(url: str) -> client.CoreV1Api:
    cfg = client.Configuration(host=url)
    return client.CoreV1Api(client.ApiClient(cfg))


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    nodes = [node("gpu-1", pool="a100", taints=[OTHER_TAINT]), node("gpu-2", pool="a100"),
             node("gpu-3", pool="a100", unschedulable=True), node("gpu-4", pool="h100")]
    with FakeApiServer(nodes) as s:
        yield s


def _taints(server: FakeApiServer, name: str) -> list[dict[str, str]]:
    return server.nodes[name]["spec"].get("taints", [])


def _condition(server: FakeApiServer, name: str) -> dict[str, str] | None:
    return next((c for c in server.nodes[name]["status"]["conditions"] if c["type"] == "GpuHealthy"), None)


def test_drain_cordons_taints_annotates_and_sets_the_condition_with_valid_requests(server: FakeApiServer) -> None:
    backend = KubernetesBackend(_api(server.url), KubernetesConfig())
    status = backend.nodes()
    assert {n: (s.pool, s.drained, s.ours) for n, s in status.items()} == {
        "gpu-1": ("a100", False, False), "gpu-2": ("a100", False, False), "gpu-3": ("a100", True, False),
        "gpu-4": ("h100", False, False)}
    backend.drain("gpu-1", "gpumond: GPU 3 lost (XID 79)", fatal=True)
    n = server.nodes["gpu-1"]
    assert n["spec"]["unschedulable"] is True
    assert _taints(server, "gpu-1") == [OTHER_TAINT, {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]
    assert n["metadata"]["annotations"][ANNOTATION] == "gpumond: GPU 3 lost (XID 79)"
    cond = _condition(server, "gpu-1")
    assert cond is not None and cond["status"] == "False" and cond["reason"] == "GpumondDrained"
    assert any(c["type"] == "Ready" for c in n["status"]["conditions"]), "the merge dropped the kubelet's condition"
    patches = [(c.path, c.content_type, c.status) for c in server.calls if c.method == "PATCH"]
    assert patches == [("/api/v1/nodes/gpu-1", JSON_PATCH, 200), ("/api/v1/nodes/gpu-1/status", STRATEGIC, 200)]
    assert server.unexpected() == []
    st = backend.nodes()["gpu-1"]
    assert st.drained and st.ours and st.reason.startswith("gpumond: ")


def test_no_execute_only_for_fatal_faults_when_configured(server: FakeApiServer) -> None:
    backend = KubernetesBackend(_api(server.url), KubernetesConfig(no_execute_on_fatal=True))
    backend.drain("gpu-2", "gpumond: GPU 0 lost", fatal=True)
    assert {t["effect"] for t in _taints(server, "gpu-2")} == {"NoSchedule", "NoExecute"}
    backend.drain("gpu-4", "gpumond: straggler node", fatal=False)
    assert {t["effect"] for t in _taints(server, "gpu-4")} == {"NoSchedule"}


def test_resume_removes_exactly_what_gpumond_added(server: FakeApiServer) -> None:
    backend = KubernetesBackend(_api(server.url), KubernetesConfig())
    backend.drain("gpu-1", "gpumond: GPU 3 lost (XID 79)", fatal=True)
    backend.resume("gpu-1")
    n = server.nodes["gpu-1"]
    assert n["spec"]["unschedulable"] is False
    assert _taints(server, "gpu-1") == [OTHER_TAINT]
    assert ANNOTATION not in n["metadata"].get("annotations", {})
    assert _condition(server, "gpu-1")["status"] == "True"
    assert all(c.status == 200 for c in server.calls), [c for c in server.calls if c.status != 200]


def test_a_node_a_person_cordoned_is_never_touched(server: FakeApiServer) -> None:
    backend = KubernetesBackend(_api(server.url), KubernetesConfig())
    before = server.nodes["gpu-3"]
    with pytest.raises(NotOurs, match="cordoned by someone else"):
        backend.drain("gpu-3", "gpumond: GPU 0 lost", fatal=True)
    with pytest.raises(NotOurs, match="not uncordoned"):
        backend.resume("gpu-3")
    assert server.nodes["gpu-3"] == before
    assert not [c for c in server.calls if c.method == "PATCH"]


def test_a_concurrent_change_makes_the_patch_fail_not_overwrite(server: FakeApiServer) -> None:
    api = _api(server.url)
    backend = KubernetesBackend(api, KubernetesConfig())
    real_read = api.read_node

    def stale_read(name: str, **kw: object) -> object:
        n = real_read(name, **kw)
        # a person patches the node between our read and our patch
        server.nodes[name]["metadata"]["resourceVersion"] = "999"
        return n

    api.read_node = stale_read  # type: ignore[method-assign]
    with pytest.raises(BackendError, match="patch node gpu-2 failed: 422 the JSON patch test failed"):
        backend.drain("gpu-2", "gpumond: GPU 0 lost", fatal=True)
    assert "unschedulable" not in server.nodes["gpu-2"]["spec"]


def test_rbac_denial_is_one_line_naming_the_permission() -> None:
    with FakeApiServer([node("gpu-1")], forbid={"PATCH /api/v1/nodes/gpu-1/status"}) as server:
        backend = KubernetesBackend(_api(server.url), KubernetesConfig())
        with pytest.raises(BackendError, match="403.*nodes/status patch") as err:
            backend.drain("gpu-1", "gpumond: GPU 0 lost", fatal=False)
        assert "\n" not in str(err.value)


def test_the_remediator_drains_and_returns_a_node_through_the_api(server: FakeApiServer, tmp_path: Path) -> None:
    now = [1000.0]
    cfg = RemediationConfig(mode="enforce", backend="kubernetes", hold_down_s=30,
                            guard={"max_nodes": 5, "max_pool_fraction": 0.5, "max_drains_per_hour": 5})
    rem = Remediator.build(cfg, tmp_path, KubernetesBackend(_api(server.url), cfg.kubernetes), clock=lambda: now[0])

    def batch(alerts: tuple[AgentAlert, ...]) -> TelemetryBatch:
        return TelemetryBatch(t=now[0], gpus=tuple(GpuSample(f"GPU-{n}", n, "0", now[0], True)
                                                    for n in ("gpu-1", "gpu-2", "gpu-4")), alerts=alerts)

    xid = AgentAlert("gpu-1", {"alertname": "GpuXidCritical", "severity": "critical", "gpu": "3", "xid": "79"})
    rem.observe(batch((xid, AgentAlert("gpu-2", {**xid.labels}))))
    actions = rem.step([])
    # two of pool a100's three nodes would be over max_pool_fraction 0.5: the guard refuses the second
    assert [(a.kind, a.node) for a in actions] == [("drain", "gpu-1"), ("refuse", "gpu-2")]
    assert server.nodes["gpu-1"]["spec"]["unschedulable"] is True
    assert "unschedulable" not in server.nodes["gpu-2"]["spec"]
    assert rem.state.breaker is not None
    assert [c.labels for c in rem.conditions()][-1] == (("alertname", "GpumondRemediationHalted"),
                                                        ("dry_run", "false"), ("severity", "critical"))
    assert server.unexpected() == []
    rem.close()
