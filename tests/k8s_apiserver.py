"""A stand-in for the Kubernetes API server, for exactly the calls gpumond's remediation backend makes.

No API server can run on the test machines, so this speaks the real REST protocol for: GET /api/v1/nodes,
GET /api/v1/nodes/{name}, PATCH /api/v1/nodes/{name} and PATCH /api/v1/nodes/{name}/status, with
`application/json-patch+json` (RFC 6902, applied by the jsonpatch library) or
`application/strategic-merge-patch+json` (maps merge, `null` deletes, `conditions` merge by `type`, other
lists replace: what the Node type declares). Every patched Node is validated against the Kubernetes schema
with kubernetes-validate (strict: unknown fields are errors) plus the API server's own checks on taints, and
refused with a 422 Status when invalid; a JSON-patch `test` that fails is a 422 too. Every request is recorded
(method, path, content type, body), and anything else answers 404/405/415 and is recorded as unexpected,
so a test can assert the backend needs no more than the RBAC the chart grants.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jsonpatch
import kubernetes_validate

K8S_VERSION = "1.30"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
_EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_NODE = re.compile(r"^/api/v1/nodes/([a-z0-9][-a-z0-9.]*)(/status)?$")


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    content_type: str
    body: Any
    status: int


def node(name: str, *, pool: str | None = None, unschedulable: bool = False,
         taints: list[dict[str, Any]] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A minimal valid Node object."""
    meta: dict[str, Any] = {"name": name, "resourceVersion": "1", "labels": {"kubernetes.io/hostname": name}}
    if pool is not None:
        meta["labels"]["gpumond.io/pool"] = pool
    if annotations:
        meta["annotations"] = dict(annotations)
    spec: dict[str, Any] = {}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": spec,
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "kubelet is posting ready status",
                                       "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}


def strategic_merge(target: Any, patch: Any, path: str = "") -> Any:
    """Strategic merge of `patch` into `target`, for the Node fields: conditions merge by type."""
    if not isinstance(patch, dict) or not isinstance(target, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target)
    for key, value in patch.items():
        where = f"{path}.{key}"
        if value is None:
            out.pop(key, None)
        elif where in (".status.conditions", ".status.addresses") and isinstance(value, list):
            merge_key = "type"
            merged = {c[merge_key]: c for c in out.get(key, [])}
            for item in value:
                if not isinstance(item, dict) or merge_key not in item:
                    raise ValueError(f"{where}: every item needs its merge key {merge_key!r}")
                merged[item[merge_key]] = strategic_merge(merged.get(item[merge_key], {}), item, where)
            out[key] = list(merged.values())
        else:
            out[key] = strategic_merge(out.get(key), value, where) if isinstance(value, dict) else copy.deepcopy(value)
    return out


def api_server_checks(obj: dict[str, Any]) -> None:
    """What the API server validates beyond the OpenAPI schema, for the fields gpumond writes."""
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    for t in obj.get("spec", {}).get("taints", []) or []:
        if t.get("effect") not in _EFFECTS:
            raise ValueError(f"spec.taints: effect {t.get('effect')!r} is not one of {sorted(_EFFECTS)}")
        if len(t.get("value", "")) > 63 or not _LABEL_VALUE.fullmatch(t.get("value", "")):
            raise ValueError(f"spec.taints: value {t.get('value')!r} is not a valid label value")
    for c in obj.get("status", {}).get("conditions", []) or []:
        if c.get("status") not in ("True", "False", "Unknown"):
            raise ValueError(f"status.conditions: status {c.get('status')!r} must be True, False or Unknown")


class FakeApiServer:
    """The stand-in on 127.0.0.1:<free port>; `nodes` is its store, `calls` what it was asked."""

    def __init__(self, nodes: list[dict[str, Any]], *, forbid: set[str] = frozenset()) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.calls: list[Call] = []
        self.forbid = set(forbid)  # "METHOD path" answered 403, as RBAC would
        self._lock = threading.Lock()
        self._version = 1
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def unexpected(self) -> list[Call]:
        return [c for c in self.calls if c.status in (404, 405, 415)]

    def _handle(self, method: str, path: str, content_type: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                return 400, _status(400, "BadRequest", "the body is not JSON")
        with self._lock:
            code, out = self._route(method, path.split("?", 1)[0], content_type, body)
            self.calls.append(Call(method, path, content_type, body, code))
            return code, out

    def _route(self, method: str, path: str, content_type: str, body: Any) -> tuple[int, dict[str, Any]]:
        if f"{method} {path}" in self.forbid:
            return 403, _status(403, "Forbidden", f"nodes is forbidden: {method} {path}")
        if path == "/api/v1/nodes":
            if method != "GET":
                return 405, _status(405, "MethodNotAllowed", method)
            return 200, {"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": str(self._version)},
                         "items": [copy.deepcopy(n) for _, n in sorted(self.nodes.items())]}
        m = _NODE.match(path)
        if m is None:
            return 404, _status(404, "NotFound", path)
        name, sub = m.group(1), m.group(2)
        current = self.nodes.get(name)
        if current is None:
            return 404, _status(404, "NotFound", f'nodes "{name}" not found')
        if method == "GET" and not sub:
            return 200, copy.deepcopy(current)
        if method != "PATCH":
            return 405, _status(405, "MethodNotAllowed", method)
        try:
            if content_type == JSON_PATCH:
                if not isinstance(body, list) or not all(isinstance(op, dict) and "op" in op and "path" in op
                                                         for op in body):
                    raise ValueError("a JSON patch is a list of operations with op and path")
                updated = jsonpatch.apply_patch(current, body)
            elif content_type == STRATEGIC:
                if not isinstance(body, dict):
                    raise ValueError("a strategic-merge patch is an object")
                updated = strategic_merge(current, body)
            else:
                return 415, _status(415, "UnsupportedMediaType", content_type)
            if sub:  # nodes/status changes status only
                updated = {**copy.deepcopy(current), "status": updated.get("status", {})}
            else:
                updated["status"] = copy.deepcopy(current["status"])
            api_server_checks(updated)
        except jsonpatch.JsonPatchTestFailed as e:
            return 422, _status(422, "Invalid", f"the JSON patch test failed: {e}")
        except (ValueError, jsonpatch.JsonPatchException, jsonpatch.JsonPointerException,
                kubernetes_validate.ValidationError) as e:
            return 422, _status(422, "Invalid", str(e).splitlines()[0])
        self._version += 1
        updated["metadata"]["resourceVersion"] = str(self._version)
        self.nodes[name] = updated
        return 200, copy.deepcopy(updated)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
                code, out = server._handle(self.command, self.path, ctype, raw)
                data = json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PATCH = do_POST = do_PUT = do_DELETE = _serve

            def log_message(self, *args: object) -> None:
                pass

        return Handler


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message, "reason": reason,
            "code": code}
