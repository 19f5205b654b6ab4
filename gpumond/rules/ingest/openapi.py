"""The OpenAPI 3.1 document of the push and findings API; the push schema comes from the pydantic models."""

from __future__ import annotations

from typing import Any

from gpumond.rules.ingest.payload import PushBody

_ERROR = {"$ref": "#/components/schemas/Error"}
FINDING_STATES = ("pending", "firing")


def _error(description: str, **headers: str) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": _ERROR}}}
    if headers:
        out["headers"] = {k: {"description": v, "schema": {"type": "string"}} for k, v in headers.items()}
    return out


def openapi_document(push: type[PushBody], version: str) -> dict[str, Any]:
    """The whole document, with the configured limits in the push schema."""
    schema = push.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.pop("$defs", {})
    components["Push"] = schema
    components["Error"] = {
        "type": "object", "required": ["error"],
        "properties": {"error": {"type": "string", "minLength": 1, "description": "one line naming the problem"}},
    }
    components["Accepted"] = {
        "type": "object", "required": ["accepted"],
        "properties": {"accepted": {"type": "integer", "minimum": 0,
                                    "description": "steps newly stored (duplicates and steps older than the "
                                                   "window are not counted)"}},
    }
    components["Finding"] = _FINDING
    return {
        "openapi": "3.1.0",
        "info": {"title": "gpumond rules service", "version": version,
                 "description": "Training jobs push step times; operators read findings. See docs/rules-api.md."},
        "paths": {"/api/v1/push": {"post": _PUSH}, "/api/v1/findings": {"get": _FINDINGS}},
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


_PUSH = {
    "operationId": "push",
    "summary": "Push one rank's recent training steps",
    "security": [{"bearer": []}],
    "requestBody": {"required": True,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Push"}}}},
    "responses": {
        "202": {"description": "stored (repeating a push is harmless: known steps are not stored twice)",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Accepted"}}}},
        "400": _error("not JSON; the message says where"),
        "401": _error("missing or wrong bearer token", **{"WWW-Authenticate": "Bearer challenge"}),
        "413": _error("body larger than limits.max_body_bytes"),
        "415": _error("not application/json, or compressed"),
        "422": _error("JSON that is not a valid push; the message names the field, e.g. steps[3].duration_s"),
        "429": _error("this client pushes too often", **{"Retry-After": "seconds to wait"}),
        "503": _error("a cap refused a new job, rank or GPU; those already held are still accepted"),
    },
}

_FINDING = {
    "type": "object",
    "required": ["kind", "job", "node", "rank", "gpu_uuid", "score", "since", "state", "evidence"],
    "properties": {
        "kind": {"type": "string", "examples": ["straggler", "io_starved_rank", "io_starved_job"]},
        "job": {"type": "string"},
        "node": {"type": ["string", "null"]},
        "rank": {"type": ["integer", "null"]},
        "gpu_uuid": {"type": ["string", "null"]},
        "score": {"type": ["number", "null"], "description": "null when not finite"},
        "since": {"type": "number", "description": "unix seconds the condition was first seen"},
        "state": {"enum": list(FINDING_STATES)},
        "evidence": {"type": "object"},
    },
}

_FINDINGS = {
    "operationId": "findings",
    "summary": "Current findings, optionally filtered (a parameter given several times matches any of its values)",
    "parameters": [
        {"name": "job", "in": "query", "required": False, "schema": {"type": "string"}},
        {"name": "kind", "in": "query", "required": False, "schema": {"type": "string"}},
        {"name": "state", "in": "query", "required": False, "schema": {"enum": list(FINDING_STATES)}},
    ],
    "responses": {
        "200": {"description": "the findings",
                "content": {"application/json": {"schema": {
                    "type": "object", "required": ["findings"],
                    "properties": {"findings": {"type": "array",
                                                "items": {"$ref": "#/components/schemas/Finding"}}}}}}},
        "400": _error("unknown query parameter or state"),
    },
}
