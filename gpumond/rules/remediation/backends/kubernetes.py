"""Kubernetes: cordon, taint and set a `GpuHealthy` node condition through the official Python client.

RBAC it needs (deploy/helm grants exactly this): nodes get/list/patch, nodes/status patch. The node itself is
changed with a JSON patch guarded by a `test` of its resourceVersion (a concurrent change by a person makes
the patch fail, never overwrite theirs); the condition with a strategic-merge patch on nodes/status, which
merges `conditions` by type. Only nodes carrying gpumond's annotation are ever uncordoned.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpumond.config.remediation import KubernetesConfig
from gpumond.rules.remediation.backends.base import BackendError, NotOurs
from gpumond.rules.remediation.plan import NodeStatus

ANNOTATION = "gpumond.io/drained-reason"
TAINT_KEY = "gpumond.io/gpu-unhealthy"
CONDITION = "GpuHealthy"


def _pointer(key: str) -> str:
    """A map key as a JSON-pointer segment (RFC 6901: ~ and / escaped)."""
    return key.replace("~", "~0").replace("/", "~1")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubernetesBackend:
    """Drain = cordon + NoSchedule taint (+ NoExecute for fatal faults when configured) + annotation +
    GpuHealthy=False; resume undoes exactly what gpumond added."""

    name = "kubernetes"

    def __init__(self, api: Any, cfg: KubernetesConfig, now: Callable[[], str] = _now) -> None:
        self._api = api  # a kubernetes.client.CoreV1Api
        self._cfg = cfg
        self._now = now

    @classmethod
    def from_config(cls, cfg: KubernetesConfig) -> KubernetesBackend:
        """The client from `kubeconfig`, or the pod's service account."""
        try:
            from kubernetes import client, config
        except ImportError:
            raise BackendError("kubernetes: the Python client is not installed (pip install 'gpumond[k8s]')") from None
        try:
            if cfg.kubeconfig is not None:
                api_client = config.new_client_from_config(config_file=str(cfg.kubeconfig))
            else:
                config.load_incluster_config()
                api_client = client.ApiClient()
        except Exception as e:  # noqa: BLE001 - the loaders raise several types for one problem: no credentials
            raise BackendError(f"kubernetes: cannot load credentials ({e}); set remediation.kubernetes.kubeconfig "
                               f"or run in a pod with a service account") from None
        return cls(client.CoreV1Api(api_client), cfg)

    # ----- reading ------------------------------------------------------------------------------------
    def nodes(self) -> Mapping[str, NodeStatus]:
        items = self._call(lambda: self._api.list_node(_request_timeout=self._cfg.timeout_s), "list nodes").items
        return {n.metadata.name: self._status(n) for n in items}

    def _status(self, n: Any) -> NodeStatus:
        labels = n.metadata.labels or {}
        annotations = n.metadata.annotations or {}
        ours = ANNOTATION in annotations
        return NodeStatus(node=n.metadata.name, pool=labels.get(self._cfg.pool_label, ""),
                          drained=bool(n.spec.unschedulable) if n.spec else False, ours=ours,
                          reason=annotations.get(ANNOTATION, "") if ours else "")

    # ----- acting ---------------------------------------------------------------------------------------
    def drain(self, node: str, reason: str, fatal: bool) -> None:
        n = self._call(lambda: self._api.read_node(node, _request_timeout=self._cfg.timeout_s), f"read node {node}")
        st = self._status(n)
        if st.drained and not st.ours:
            raise NotOurs(f"kubernetes: node {node} is already cordoned by someone else; not touched")
        effects = ["NoSchedule"] + (["NoExecute"] if fatal and self._cfg.no_execute_on_fatal else [])
        taints = [t for t in self._taints(n) if t["key"] != TAINT_KEY]
        taints += [{"key": TAINT_KEY, "value": "true", "effect": e} for e in effects]
        ops = self._guarded(n, [{"op": "add", "path": "/spec/unschedulable", "value": True},
                                {"op": "add", "path": "/spec/taints", "value": taints}])
        ops += self._annotation_ops(n, reason)
        self._patch(node, ops)
        self._condition(node, "False", "GpumondDrained", reason)

    def resume(self, node: str) -> None:
        n = self._call(lambda: self._api.read_node(node, _request_timeout=self._cfg.timeout_s), f"read node {node}")
        if not self._status(n).ours:
            raise NotOurs(f"kubernetes: node {node} carries no {ANNOTATION} annotation; not uncordoned")
        taints = [t for t in self._taints(n) if t["key"] != TAINT_KEY]
        ops = self._guarded(n, [{"op": "add", "path": "/spec/unschedulable", "value": False},
                                {"op": "add", "path": "/spec/taints", "value": taints},
                                {"op": "remove", "path": f"/metadata/annotations/{_pointer(ANNOTATION)}"}])
        self._patch(node, ops)
        self._condition(node, "True", "GpumondReturned", "every condition clear for the hold-down; returned by gpumond")

    # ----- helpers ------------------------------------------------------------------------------------
    @staticmethod
    def _taints(n: Any) -> list[dict[str, Any]]:
        out = []
        for t in (n.spec.taints if n.spec and n.spec.taints else []):
            taint = {"key": t.key, "effect": t.effect}
            if t.value is not None:
                taint["value"] = t.value
            if getattr(t, "time_added", None) is not None:
                taint["timeAdded"] = t.time_added.strftime("%Y-%m-%dT%H:%M:%SZ") if hasattr(
                    t.time_added, "strftime") else str(t.time_added)
            out.append(taint)
        return out

    @staticmethod
    def _guarded(n: Any, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # The test op makes the API server refuse the patch if anyone changed the node since we read it.
        return [{"op": "test", "path": "/metadata/resourceVersion", "value": n.metadata.resource_version}, *ops]

    @staticmethod
    def _annotation_ops(n: Any, reason: str) -> list[dict[str, Any]]:
        if n.metadata.annotations:
            return [{"op": "add", "path": f"/metadata/annotations/{_pointer(ANNOTATION)}", "value": reason}]
        return [{"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION: reason}}]

    def _patch(self, node: str, ops: list[dict[str, Any]]) -> None:
        self._call(lambda: self._api.patch_node(node, ops, _content_type="application/json-patch+json",
                                                _request_timeout=self._cfg.timeout_s), f"patch node {node}")

    def _condition(self, node: str, status: str, reason: str, message: str) -> None:
        now = self._now()
        body = {"status": {"conditions": [{"type": CONDITION, "status": status, "reason": reason,
                                           "message": message, "lastHeartbeatTime": now,
                                           "lastTransitionTime": now}]}}
        self._call(lambda: self._api.patch_node_status(
            node, body, _content_type="application/strategic-merge-patch+json", _request_timeout=self._cfg.timeout_s),
            f"patch node {node} status")

    @staticmethod
    def _call(fn: Callable[[], Any], what: str) -> Any:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - ApiException, urllib3 and socket errors: one line each
            raise BackendError(f"kubernetes: {what} failed: {_one_line(e)}") from None


def _one_line(e: Exception) -> str:
    """An API error as `422 Invalid: <the server's message>`, with what to check for the usual ones."""
    status = getattr(e, "status", None)
    if status is None:
        return (str(e).strip().splitlines() or [type(e).__name__])[0]
    message = getattr(e, "reason", "") or ""
    try:
        body = json.loads(getattr(e, "body", None) or "{}")
        message = body.get("message") or message
    except (ValueError, AttributeError):
        pass
    hint = {403: " (RBAC: the service account needs nodes get/list/patch and nodes/status patch)",
            409: " (the node changed meanwhile; retried next evaluation)"}.get(status, "")
    return f"{status} {' '.join(str(message).split())[:300]}{hint}"
