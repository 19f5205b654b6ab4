"""The OpenAPI 3.1 document of the push and findings API; the push schema comes from the pydantic models."""

from __future__ import annotations

from typing import Any

from gpumond.push.body import PushBody
from gpumond.rules.store import CAPS
from gpumond.wire.media import COLUMNS_TYPE, JSON_TYPE

_ERROR = {"$ref": "#/components/schemas/Error"}
FINDING_STATES = ("pending", "firing")


def _error(description: str, **headers: str) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": _ERROR}}}
    if headers:
        out["headers"] = {k: {"description": v, "schema": {"type": "string"}} for k, v in headers.items()}
    return out


def openapi_document(push: type[PushBody], version: str, columns: type[PushBody] | None = None) -> dict[str, Any]:
    """The whole document, with the configured limits in the push schemas (both encodings when `columns`)."""
    schema = push.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.pop("$defs", {})
    components["Push"] = schema
    body = {JSON_TYPE: {"schema": {"$ref": "#/components/schemas/Push"}}}
    if columns is not None:
        schema = columns.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        schema["description"] = (
            "The columnar encoding of a push: the same fields, and `columns` instead of `steps`. Each column is "
            "standard base64 (padded) of little-endian 8-byte values, all columns the same length (the number "
            "of steps); step and samples are int64, the others float64. Every value obeys the Step rules; a "
            "NaN comm_wait_s is a step that did not measure it, a samples of -1 one that did not count them.")
        components["ColumnsPush"] = schema
        body[COLUMNS_TYPE] = {"schema": {"$ref": "#/components/schemas/ColumnsPush"}}
    components["Error"] = {
        "type": "object", "required": ["error"],
        "properties": {"error": {"type": "string", "minLength": 1, "description": "one line naming the problem"}},
    }
    components["Accepted"] = {
        "type": "object", "required": ["accepted"],
        "properties": {
            "accepted": {"type": "integer", "minimum": 0,
                         "description": "steps newly stored (duplicates and steps older than the window are not "
                                        "counted)"},
            "dropped": {
                "type": "object", "additionalProperties": False,
                "description": "present only when new steps were not kept, by reason: per_rank_window (the "
                               "push's oldest new steps beyond limits.max_steps_per_rank, which one rank's "
                               "window cannot hold), steps_held (no room under limits.max_steps_held)",
                "properties": {"per_rank_window": {"type": "integer", "minimum": 1},
                               "steps_held": {"type": "integer", "minimum": 1}}},
        },
    }
    components["CapRefusal"] = {
        "type": "object", "required": ["error"],
        "properties": {"error": {"type": "string", "minLength": 1},
                       "cap": {"enum": list(CAPS), "description": "present when a cap refused the push (not "
                                                                  "for the rate limit)"}},
    }
    components["Misdirected"] = {
        "type": "object", "required": ["error", "shard", "shards"],
        "properties": {"error": {"type": "string", "minLength": 1},
                       "shard": {"type": "integer", "minimum": 0,
                                 "description": "the shard that evaluates this job: crc32(job) mod shards"},
                       "shards": {"type": "integer", "minimum": 1, "description": "N of this replica's I/N"}},
    }
    # JSON Schema cannot compare two fields; say the rules it cannot express where a client reads the Step.
    step = components.get("Step")
    if step is not None:
        step["description"] = (
            "One training step. Beyond this schema: data_wait_s <= duration_s, and when comm_wait_s is given "
            "data_wait_s + comm_wait_s <= duration_s (both +1 µs for clock rounding), i.e. comm_wait_s <= "
            "duration_s - data_wait_s; a step breaking either is refused with 422 naming it.")
        step["x-gpumond-rules"] = ["data_wait_s <= duration_s + 1e-6",
                                   "comm_wait_s == null or data_wait_s + comm_wait_s <= duration_s + 1e-6"]
    components["Finding"] = _FINDING
    return {
        "openapi": "3.1.0",
        "info": {"title": "gpumond rules service", "version": version,
                 "description": "Training jobs push step times; operators read findings. See docs/rules-api.md."},
        "paths": {"/api/v1/push": {"post": {**_PUSH, "requestBody": {"required": True, "content": body}}},
                  "/api/v1/findings": {"get": _FINDINGS}},
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


_PUSH = {
    "operationId": "push",
    "summary": "Push one rank's recent training steps",
    "security": [{"bearer": []}],
    "responses": {
        "202": {"description": "stored (repeating a push is harmless: known steps are not stored twice)",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Accepted"}}}},
        "400": _error("not JSON; the message says where"),
        "401": _error("missing or wrong bearer token", **{"WWW-Authenticate": "Bearer challenge"}),
        "413": _error("body larger than limits.max_body_bytes"),
        "415": _error("neither application/json nor application/vnd.gpumond.columns+json, or compressed"),
        "422": _error("JSON that is not a valid push; the message names the field, e.g. steps[3].duration_s (in "
                      "either encoding: a step by its place in the push) or columns.end, "
                      "including the rules between fields the Step schema states in words (comm_wait_s <= "
                      "duration_s - data_wait_s)"),
        "421": {"description": "Misdirected Request: this replica runs with shard I/N and the push's job belongs "
                               "to another shard, which alone evaluates it; nothing was stored. Do not retry "
                               "here: push to the shard the body names (the job SDK does, given GPUMOND_SHARDS "
                               "and {shard} in GPUMOND_ENDPOINT)",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Misdirected"}}}},
        "429": {"description": "this client pushes too often (the rate limit), or a cap refused a new job, rank, "
                               "GPU or steps for a rank holding none (`cap` names it; those already held are "
                               "still accepted): back off and retry after Retry-After",
                "headers": {"Retry-After": {"description": "seconds to wait", "schema": {"type": "string"}}},
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CapRefusal"}}}},
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
