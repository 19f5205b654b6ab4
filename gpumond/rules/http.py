"""The rules service's HTTP surface: push (its own ASGI endpoint), and a Starlette app for findings, metrics,
health and OpenAPI."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gpumond.config.rules import RulesConfig
from gpumond.rules.ingest.accept import Ingest
from gpumond.rules.ingest.endpoint import PUSH_PATH, PushEndpoint
from gpumond.rules.ingest.openapi import FINDING_STATES, openapi_document
from gpumond.rules.ingest.stats import IngestStats
from gpumond.rules.store import RankStore
from gpumond.rules.types import Finding

log = logging.getLogger("gpumond.rules.http")

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_FILTERS = ("job", "kind", "state")


def build_app(*, config: RulesConfig, rank_store: RankStore, findings: Callable[[], Sequence[Finding]],
              metrics: Callable[[], bytes], ready: Callable[[], tuple[bool, str]], clock: Callable[[], float],
              stats: IngestStats | None = None, alerts: Callable[[], bytes] = lambda: b'{"alerts":[]}',
              health: Callable[[], tuple[bool, str]] = lambda: (True, "ok"),
              jobs: Callable[[], bytes] = lambda: b'{"jobs":[]}',
              power_offers: Callable[[str], bytes] = lambda node: b'{"offers":[]}') -> RulesApp:
    """The rules service's ASGI app; `stats` (made when None) is also at app.state.ingest_stats."""
    # findings, metrics and ready are called on a worker thread: they must be thread-safe, and
    # may then take a moment without stalling pushes.
    ingest = Ingest(config=config, store=rank_store, clock=clock, stats=stats)
    spec = _json(openapi_document(ingest.model, _version(), ingest.columns_model))

    push = PushEndpoint(ingest)

    async def list_findings(request: Request) -> Response:
        unknown = sorted(set(request.query_params) - set(_FILTERS))
        if unknown:
            return _error(400, f"unknown query parameter {unknown[0]!r} (use job, kind, state)")
        wanted = {k: set(request.query_params.getlist(k)) for k in _FILTERS if k in request.query_params}
        bad = wanted.get("state", set()) - set(FINDING_STATES)
        if bad:
            return _error(400, f"state: must be one of {', '.join(FINDING_STATES)} (got {sorted(bad)[0]!r})")
        found = await run_in_threadpool(findings)
        selected = [f for f in found if all(getattr(f, k) in v for k, v in wanted.items())]
        return Response(_json({"findings": [_finding(f) for f in selected]}), media_type="application/json")

    async def serve_metrics(request: Request) -> Response:
        return Response(await run_in_threadpool(metrics), media_type=METRICS_TYPE)

    async def list_alerts(request: Request) -> Response:
        return Response(await run_in_threadpool(alerts), media_type="application/json")

    async def list_jobs(request: Request) -> Response:
        return Response(await run_in_threadpool(jobs), media_type="application/json")

    async def list_power_offers(request: Request) -> Response:
        unknown = sorted(set(request.query_params) - {"node"})
        if unknown:
            return _error(400, f"unknown query parameter {unknown[0]!r} (use node)")
        node = request.query_params.get("node")
        if not node:
            return _error(400, "node: required (the agent's node_name)")
        return Response(await run_in_threadpool(power_offers, node), media_type="application/json")

    async def healthz(request: Request) -> Response:
        ok, why = await run_in_threadpool(health)
        return Response(why + "\n", status_code=200 if ok else 503, media_type="text/plain")

    async def readyz(request: Request) -> Response:
        ok, why = await run_in_threadpool(ready)
        return Response((why or ("ready" if ok else "not ready")) + "\n", status_code=200 if ok else 503,
                        media_type="text/plain")

    async def openapi(request: Request) -> Response:
        return Response(spec, media_type="application/json")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = {404: f"not found: {request.url.path} (the API is described at /api/v1/openapi.json)",
                   405: f"method {request.method} not allowed on {request.url.path}"}.get(exc.status_code, exc.detail)
        return _error(exc.status_code, message, exc.headers)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.error("request failed", exc_info=exc, extra={"path": request.url.path})
        return _error(500, "internal error; the rules service logged it")

    app = Starlette(
        routes=[
            Route(PUSH_PATH, push, methods=["POST"]),  # reached for a path the front does not match
            Route("/api/v1/findings", list_findings, methods=["GET"]),
            Route("/api/v1/alerts", list_alerts, methods=["GET"]),
            Route("/api/v1/jobs", list_jobs, methods=["GET"]),
            Route("/api/v1/power/offers", list_power_offers, methods=["GET"]),
            Route("/api/v1/openapi.json", openapi, methods=["GET"]),
            Route("/metrics", serve_metrics, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
    )
    app.state.ingest_stats = ingest.stats
    return RulesApp(app, push)


class RulesApp:
    """The rules service's ASGI app: POST /api/v1/push straight to its endpoint, every other request to Starlette."""

    # The push is the hot path: Starlette's middleware, router and Request/Response were about a third of a
    # push's own work in process (docs/rules-api.md), for nothing the endpoint needs. Starlette still routes the
    # path for every other method (405 with Allow) to the same endpoint object: the push has one implementation.

    def __init__(self, app: Starlette, push: PushEndpoint) -> None:
        self.starlette = app
        self.state = app.state
        self._push = push

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == PUSH_PATH and scope["method"] == "POST":
            await self._push(scope, receive, send)
        else:
            await self.starlette(scope, receive, send)


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(_json({"error": message}), status_code=status, headers=dict(headers or {}),
                    media_type="application/json")


def _finding(f: Finding) -> dict[str, Any]:
    return {"kind": f.kind, "job": f.job, "node": f.node, "rank": f.rank, "gpu_uuid": f.gpu_uuid, "score": f.score,
            "since": f.since, "state": f.state, "evidence": dict(f.evidence)}


def _json(value: object) -> bytes:
    # Findings carry floats computed from telemetry: a NaN or inf becomes null, never invalid JSON.
    return json.dumps(_finite(value), separators=(",", ":"), default=str, allow_nan=False).encode()


def _finite(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_finite(v) for v in value]
    return value


def _version() -> str:
    try:
        return version("gpumond")
    except PackageNotFoundError:
        return "0"
