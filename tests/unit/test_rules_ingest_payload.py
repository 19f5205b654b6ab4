"""Push body validation: what is accepted, and the one-line message naming the field when not."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np
import pytest

from gpumond.push.body import PayloadError, columns_model, parse, push_model
from gpumond.rules.types import RankInfo, StepRecord
from tests.push_bodies import ENCODINGS, encode, pack

MODEL = push_model(32, 8)  # max_string_len, max_steps
COLUMNS = columns_model(32, 8)
MODELS = {"json": MODEL, "columns": COLUMNS}
UUID = "GPU-5b0c1234-aaaa-bbbb-cccc-0123456789ab"


def step(n: int = 1200, **over: Any) -> dict[str, Any]:
    return {"step": n, "end": 1763760000.12, "duration_s": 0.84, "data_wait_s": 0.02, "samples": 32, **over}


def push(**over: Any) -> dict[str, Any]:
    body = {"job": "llama-70b-r3", "rank": 17, "world_size": 64, "node": "gpu-node-03", "gpu_uuid": UUID,
            "group": "pp-stage-2", "steps": [step()]}
    body.update(over)
    return body


def refused(body: Any, encoding: str = "json") -> tuple[int, str]:
    raw = body if isinstance(body, bytes) else encode(body, encoding)
    if raw is None:
        pytest.skip("only the JSON encoding can say this body")
    with pytest.raises(PayloadError) as info:
        parse(MODELS[encoding], raw)
    assert "\n" not in info.value.message
    return info.value.status, info.value.message


def parsed(body: Any, encoding: str):
    raw = encode(body, encoding)
    assert raw is not None
    return parse(MODELS[encoding], raw)


def held(p) -> list[tuple]:
    """The push's steps as its columns say: (step, end, duration_s, data_wait_s, comm_wait_s or None)."""
    c = p.step_columns()
    return [(n, e, d, w, None if math.isnan(x) else x) for n, (e, d, w, x) in zip(c.step.tolist(), c.values.T.tolist())]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_the_design_example_parses_into_the_shared_types(encoding: str) -> None:
    p = parsed(push(), encoding)
    assert p.rank_info() == RankInfo("llama-70b-r3", 17, 64, "gpu-node-03", UUID, "pp-stage-2")
    assert held(p) == [(1200, 1763760000.12, 0.84, 0.02, None)]
    c = p.step_columns()
    assert c.step.dtype == np.int64 and c.values.dtype == np.float64 and c.values.shape == (4, 1)
    if encoding == "json":
        assert p.steps == [StepRecord(1200, 1763760000.12, 0.84, 0.02, 32)]
        assert type(p.steps[0]) is StepRecord


def test_optional_fields_and_an_empty_heartbeat() -> None:
    body = push(steps=[{"step": 0, "end": 1, "duration_s": 0, "data_wait_s": 0}])
    del body["group"]
    p = parse(MODEL, json.dumps(body).encode())
    assert p.group is None and p.steps[0].samples is None
    assert parse(MODEL, json.dumps(push(steps=[])).encode()).steps == []


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_comm_wait_is_optional_and_kept_when_given(encoding: str) -> None:
    without = parsed(push(), encoding)
    assert held(without)[0][4] is None  # an older SDK
    null = parsed(push(steps=[step(comm_wait_s=None)]), encoding)
    assert held(null)[0][4] is None
    given = parsed(push(steps=[step(comm_wait_s=0.31), step(1201, comm_wait_s=0)]), encoding)
    assert [s[4] for s in held(given)] == [0.31, 0.0]
    if encoding == "json":
        assert given.steps[0] == StepRecord(1200, 1763760000.12, 0.84, 0.02, 32, 0.31)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_comm_wait_may_fill_the_step_with_the_data_wait_up_to_the_rounding_slack(encoding: str) -> None:
    # 0.84 - 0.02 exactly, then 1 µs over it: both within the slack the data wait check also allows.
    for comm in (0.82, 0.82 + 1e-6, 0.84 + 1e-6 - 0.02):
        p = parsed(push(steps=[step(comm_wait_s=comm)]), encoding)
        assert held(p)[0][4] == comm
    p = parsed(push(steps=[step(data_wait_s=0, comm_wait_s=0.84)]), encoding)
    assert held(p)[0][4] == 0.84


def test_gpu_uuid_is_stored_lowercase_like_the_agent_exports_it() -> None:
    p = parse(MODEL, json.dumps(push(gpu_uuid=UUID.upper().replace("GPU-", "GPU-"))).encode())
    assert p.gpu_uuid == UUID


@pytest.mark.parametrize(("pushed", "stored"), [
    ("MIG-5B0C1234-AAAA-BBBB-CCCC-0123456789AB", "MIG-5b0c1234-aaaa-bbbb-cccc-0123456789ab"),
    (f"MIG-{UUID.upper().replace('GPU-', 'GPU-')}/03/0", f"MIG-{UUID}/3/0"),  # the pre-R470 name of a slice
])
def test_mig_devices_are_accepted_in_both_forms(pushed: str, stored: str) -> None:
    p = parse(MODEL, json.dumps(push(gpu_uuid=pushed)).encode())
    assert p.gpu_uuid == stored


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_integer_numbers_are_fine_where_floats_are_expected(encoding: str) -> None:
    p = parsed(push(steps=[step(end=1763760000, duration_s=1, data_wait_s=1)]), encoding)
    assert held(p)[0][2] == 1.0


def test_unknown_keys_are_ignored_for_newer_sdks() -> None:
    p = parse(MODEL, json.dumps(push(sdk="0.2", steps=[step(gpu_ms=3)])).encode())
    assert p.job == "llama-70b-r3"


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"", 400, "invalid JSON: EOF while parsing a value at line 1 column 0"),
        (b'{"job": "a",', 400, "invalid JSON: EOF while parsing"),
        (b"\xff{}", 400, "invalid JSON: expected value at line 1 column 1"),
        (b"[1, 2]", 422, "body: must be a JSON object"),
        (b'"push"', 422, "body: must be a JSON object"),
        (push(steps=[step(duration_s=-0.5)]), 422, "steps[0].duration_s: must be at least 0 (got -0.5)"),
        (push(steps=[step(), step(3, data_wait_s=-1)]), 422, "steps[1].data_wait_s: must be at least 0 (got -1)"),
        (push(steps=[step(data_wait_s=0.9)]), 422, "steps[0].data_wait_s: must be at most duration_s (0.84) (got 0.9)"),
        (push(steps=[step(duration_s=86401, data_wait_s=0)]), 422, "steps[0].duration_s: must be at most 86400"),
        (push(steps=[step(-1)]), 422, "steps[0].step: must be at least 0 (got -1)"),
        (push(steps=[step("12")]), 422, "steps[0].step: must be a valid integer (got '12')"),
        (push(steps=[step(1.5)]), 422, "steps[0].step: must be a valid integer"),
        (push(steps=[step(True)]), 422, "steps[0].step: must be a valid integer"),
        (push(steps=[step(2**64)]), 422, "steps[0].step: must be"),
        (push(steps=[step(end="now")]), 422, "steps[0].end: must be a valid number (got 'now')"),
        (push(steps=[step(end=-1)]), 422, "steps[0].end: must be at least 0"),
        (push(steps=[step(samples=-3)]), 422, "steps[0].samples: must be at least 0 (got -3)"),
        (push(steps=[step(), step(1201, comm_wait_s=-0.1)]), 422,
         "steps[1].comm_wait_s: must be at least 0 (got -0.1)"),
        (push(steps=[step(comm_wait_s=0.9)]), 422, "steps[0].comm_wait_s: must be at most duration_s (0.84) (got 0.9)"),
        (push(steps=[step(data_wait_s=0, comm_wait_s=0.841)]), 422,
         "steps[0].comm_wait_s: must be at most duration_s (0.84) (got 0.841)"),
        (push(steps=[step(comm_wait_s=0.83)]), 422,
         "steps[0].comm_wait_s: must be at most duration_s - data_wait_s (0.82) (got 0.83)"),
        (push(steps=[step(data_wait_s=0.5, comm_wait_s=0.5)]), 422,
         "steps[0].comm_wait_s: must be at most duration_s - data_wait_s (0.34) (got 0.5)"),
        (push(steps=[step(data_wait_s=0.9, comm_wait_s=0.1)]), 422,  # the data wait is named first
         "steps[0].data_wait_s: must be at most duration_s (0.84) (got 0.9)"),
        (push(steps=[step(comm_wait_s="0.1")]), 422, "steps[0].comm_wait_s: must be a valid number (got '0.1')"),
        (push(steps=[step(comm_wait_s=[0.1])]), 422, "steps[0].comm_wait_s: must be a valid number"),
        (push(steps=[step(comm_wait_s=True)]), 422, "steps[0].comm_wait_s: must be a valid number"),
        (push(steps=[{"step": 1, "duration_s": 1, "data_wait_s": 0}]), 422, "steps[0].end: required key is missing"),
        (push(steps=[5]), 422, "steps[0]: must be an object (got 5)"),
        (push(steps=[step()] * 9), 422, "steps: must have at most 8 items"),
        (push(steps={"0": step()}), 422, "steps: must be a list"),
        (push(rank=64), 422, "rank: must be less than world_size (64) (got 64)"),
        (push(rank=-1), 422, "rank: must be at least 0 (got -1)"),
        (push(rank="17"), 422, "rank: must be a valid integer (got '17')"),
        (push(world_size=0, rank=0), 422, "world_size: must be at least 1 (got 0)"),
        (push(world_size=2**20 + 1), 422, "world_size: must be at most 1048576 (got 1048577)"),
        (push(job=""), 422, "job: must not be empty"),
        (push(job="j" * 33), 422, "job: must have at most 32 characters"),
        (push(job=17), 422, "job: must be a valid string (got 17)"),
        (push(node="gpu\nnode"), 422, "node: must not contain control characters"),
        (push(group="\x00"), 422, "group: must not contain control characters"),
        (push(gpu_uuid="MIG-5b0c1234-aaaa"), 422, "gpu_uuid: must be an NVML GPU UUID"),
        (push(gpu_uuid=f"MIG-{UUID}/1"), 422, "gpu_uuid: must be an NVML GPU UUID"),  # old form needs gi and ci
        (push(gpu_uuid="GPU-xyz"), 422, "gpu_uuid: must be an NVML GPU UUID, GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"),
        ({k: v for k, v in push().items() if k != "steps"}, 422, "steps: required key is missing"),
        ({}, 422, "job: required key is missing (+5 more)"),
    ],
)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_refusals_name_the_field(body: Any, status: int, message: str, encoding: str) -> None:
    got_status, got = refused(body, encoding)
    assert got_status == status
    if encoding == "columns":
        message = IN_COLUMNS.get(message, message)
    assert got.startswith(message), got


# Where the columnar encoding words a refusal differently (it has no list of steps to count).
IN_COLUMNS = {"steps: must have at most 8 items": "columns: must have at most 8 steps (got 9)"}


def columnar(**columns: Any) -> bytes:
    body = {k: v for k, v in push().items() if k != "steps"}
    body["columns"] = {"step": pack("q", [1]), "end": pack("d", [1763760000.0]), "duration_s": pack("d", [0.84]),
                       "data_wait_s": pack("d", [0.02]), **columns}
    return json.dumps({**body, "columns": {k: v for k, v in body["columns"].items() if v is not None}}).encode()


@pytest.mark.parametrize(("body", "message"), [
    (columnar(end="not base64!"), "columns.end: must be standard base64 with padding"),
    (columnar(end=pack("d", [1.0])[:-1]), "columns.end: must be standard base64 with padding"),
    (columnar(end="AAAA"), "columns.end: must hold 8-byte values (got 3 bytes)"),
    (columnar(end=pack("d", [1.0, 2.0])), "columns.end: must hold as many values as columns.step (1) (got 2)"),
    (columnar(duration_s=None), "columns.duration_s: required key is missing"),
    (columnar(step=pack("q", [-1])), "steps[0].step: must be at least 0 (got -1)"),
    (columnar(duration_s=pack("d", [math.nan])), "steps[0].duration_s: must be a finite number"),
    (columnar(end=pack("d", [math.inf])), "steps[0].end: must be a finite number"),
    (columnar(comm_wait_s=pack("d", [math.inf])), "steps[0].comm_wait_s: must be a finite number, or NaN"),
    (columnar(comm_wait_s=pack("d", [-0.5])), "steps[0].comm_wait_s: must be at least 0 (got -0.5)"),
    (columnar(samples=pack("q", [-2])), "steps[0].samples: must be at least 0, or -1 for none (got -2)"),
    (columnar(step=pack("q", [1] * 9), **{k: pack("d", [0.1] * 9) for k in ("end", "duration_s", "data_wait_s")}),
     "columns: must have at most 8 steps (got 9)"),
    (json.dumps({k: v for k, v in push().items() if k != "steps"}).encode(), "columns: required key is missing"),
])
def test_columnar_refusals_name_the_column_or_the_step(body: bytes, message: str) -> None:
    assert refused(body, "columns") == (422, refused(body, "columns")[1])
    assert refused(body, "columns")[1].startswith(message), refused(body, "columns")


def test_columnar_nan_comm_wait_means_not_measured_and_samples_may_be_minus_one() -> None:
    p = parse(COLUMNS, columnar(comm_wait_s=pack("d", [math.nan]), samples=pack("q", [-1])))
    assert held(p) == [(1, 1763760000.0, 0.84, 0.02, None)]


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
@pytest.mark.parametrize("key", ["duration_s", "comm_wait_s"])
def test_non_finite_numbers_are_refused(literal: bytes, key: str) -> None:  # JSON; columns: above
    raw = json.dumps(push(steps=[step(**{key: 777.5})])).encode().replace(b"777.5", literal)
    status, message = refused(raw)
    assert status == 422
    assert message.startswith(f"steps[0].{key}: must be a finite number"), message


def test_the_model_is_cached_per_limits() -> None:
    assert push_model(32, 8) is MODEL and columns_model(32, 8) is COLUMNS
    assert push_model(64, 8) is not MODEL


def test_the_json_schema_states_the_limits() -> None:
    schema = MODEL.model_json_schema()
    assert schema["properties"]["steps"]["maxItems"] == 8
    assert schema["properties"]["job"]["maxLength"] == 32
    assert schema["properties"]["world_size"]["maximum"] == 2**20
    uuid_pattern = re.compile(schema["properties"]["gpu_uuid"]["pattern"])
    assert all(uuid_pattern.search(u) for u in (UUID, "MIG" + UUID[3:], f"MIG-{UUID}/1/0"))
    assert not any(uuid_pattern.search(u) for u in (UUID + "x", "x" + UUID, f"MIG-{UUID}"))
    step_schema = schema["$defs"]["Step"]
    assert set(step_schema["required"]) == {"step", "end", "duration_s", "data_wait_s"}
    assert step_schema["properties"]["duration_s"]["minimum"] == 0
    comm = step_schema["properties"]["comm_wait_s"]
    assert comm["anyOf"] == [{"type": "number", "minimum": 0}, {"type": "null"}] and comm["default"] is None
    assert "data_wait_s + comm_wait_s" in comm["description"]


def test_the_openapi_document_shows_the_optional_comm_wait() -> None:
    from gpumond.rules.ingest.openapi import openapi_document

    schemas = openapi_document(MODEL, "test")["components"]["schemas"]
    step_schema = schemas["Step"]
    assert "comm_wait_s" in step_schema["properties"] and "comm_wait_s" not in step_schema["required"]
    assert schemas["Push"]["properties"]["steps"]["items"] == {"$ref": "#/components/schemas/Step"}


def test_the_openapi_document_offers_both_encodings() -> None:
    from gpumond.rules.ingest.openapi import openapi_document

    doc = openapi_document(MODEL, "test", COLUMNS)
    content = doc["paths"]["/api/v1/push"]["post"]["requestBody"]["content"]
    assert content == {"application/json": {"schema": {"$ref": "#/components/schemas/Push"}},
                       "application/vnd.gpumond.columns+json": {"schema": {"$ref": "#/components/schemas/ColumnsPush"}}}
    columns = doc["components"]["schemas"]["ColumnsPush"]
    assert "columns" in columns["required"] and "steps" not in columns["properties"]
    assert set(doc["components"]["schemas"]["Columns"]["required"]) == {"step", "end", "duration_s", "data_wait_s"}
