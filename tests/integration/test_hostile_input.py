"""The rules service (a real process) against hostile input: no 5xx, every refusal documented, logs one line each.

Two generators: tests/integration/hostile.py (malformed JSON, lying lengths, deep nesting, NaN and huge
numbers, control characters, odd headers and methods, then label floods to every cap), and schemathesis
against the OpenAPI document the service itself serves. Caps are small here so that every one is reached.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.alert_helpers import RulesDaemon
from tests.integration.helpers import http_get
from tests.integration.hostile import hostile_requests, raw_request

pytestmark = pytest.mark.integration

TOKEN = "hostile-token-0123456789"
LIMITS = {"max_jobs": 20, "max_ranks": 60, "max_gpus": 40, "max_steps_held": 3000, "max_steps_per_rank": 2048,
          "pushes_per_second_per_client": 1_000_000, "burst": 1_000_000}
FLOODS = {"jobs": 40, "ranks": 100, "gpus": 80, "steps": 6000}  # each past its cap
# Every status the push API documents (docs/rules-api.md), plus 404/405 for other paths and methods, and
# uvicorn's 400 for what is not HTTP. None: the server closed without answering (a request it cannot frame).
DOCUMENTED = {202, 400, 401, 404, 405, 413, 415, 422, 429}
LOGFMT = re.compile(r'^ts=\S+ level=\w+ logger=\S+ msg=("(?:[^"\\]|\\.)*"|\S+)( [^\s="]+=("(?:[^"\\]|\\.)*"|\S*))*$')


class Rules(RulesDaemon):
    """The rules service with small caps, so every flood reaches its cap within the test."""

    def __init__(self, workdir: Path, http: dict | None = None) -> None:
        super().__init__(workdir, {"tokens": [TOKEN], "state_dir": str(workdir / "state"), "limits": LIMITS,
                                   **({"http": http} if http else {})})


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rules]:
    service = Rules(tmp_path_factory.mktemp("hostile")).start()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture
def fresh_rules(tmp_path: Path) -> Iterator[Rules]:
    service = Rules(tmp_path).start()
    try:
        yield service
    finally:
        service.stop()


@pytest.mark.parametrize("encoding", ["json", "columns"])
def test_hostile_pushes_get_no_5xx_and_only_documented_refusals(rules: Rules, encoding: str,
                                                                 request: pytest.FixtureRequest) -> None:
    # The JSON run throws at the module's service (the log test below reads what it wrote); the columnar run
    # needs its own, since its floods must find every cap empty.
    if encoding == "columns":
        rules = request.getfixturevalue("fresh_rules")
    by_kind: dict[str, Counter] = {}
    for kind, request_bytes, half_close in hostile_requests(TOKEN, floods=FLOODS, encoding=encoding):
        status = raw_request(rules.port, request_bytes, half_close=half_close)
        by_kind.setdefault(kind, Counter())[status] += 1
    every = sum(by_kind.values(), Counter())
    assert sum(every.values()) > 400
    server_errors = {k: c for k, c in by_kind.items() if any(s is not None and s >= 500 for s in c)}
    assert server_errors == {}, server_errors
    undocumented = {k: c for k, c in by_kind.items() if set(c) - DOCUMENTED - {None}}
    assert undocumented == {}, undocumented
    # a closed connection without an answer only for requests that cannot be framed
    assert {k for k, c in by_kind.items() if None in c} <= {"lying_length", "headers"}, by_kind
    for kind in ("flood_jobs", "flood_ranks", "flood_gpus"):  # every cap reached, and refused as documented
        assert by_kind[kind][202] > 0 and by_kind[kind][429] > 0, (kind, by_kind[kind])
    assert by_kind["flood_steps"][202] > 0  # partly kept: {"dropped": {"steps_held": n}}
    assert all(by_kind[k][422] for k in ("control_chars", "numbers"))
    # still serving, and the caps held
    status, _, body = http_get(f"{rules.url}/metrics")
    assert status == 200
    held = dict(re.findall(rb'gpumond_rules_held\{kind="(\w+)"\} (\S+)', body))
    assert float(held[b"jobs"]) <= LIMITS["max_jobs"] and float(held[b"ranks"]) <= LIMITS["max_ranks"]
    assert float(held[b"gpus"]) <= LIMITS["max_gpus"] and float(held[b"steps"]) <= LIMITS["max_steps_held"]


def test_the_served_openapi_document_survives_schemathesis(rules: Rules) -> None:
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                                    status_code_conformance)

    schema = schemathesis.openapi.from_url(f"{rules.url}/api/v1/openapi.json")
    statuses: Counter = Counter()
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
    for path, method, examples in (("/api/v1/push", "POST", 250), ("/api/v1/findings", "GET", 50)):
        operation = schema[path][method]

        @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def run(case) -> None:
            response = case.call(base_url=rules.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
            statuses[(path, response.status_code)] += 1
            case.validate_response(response, checks=checks)

        run()
    assert sum(statuses.values()) >= 200, statuses
    assert not any(code >= 500 for _, code in statuses), statuses


def test_the_service_logs_stayed_one_line_each(rules: Rules) -> None:
    """Runs after the tests above have thrown everything at the service."""
    assert rules.stop() == 0
    lines = rules.stderr().splitlines()
    bad = [line for line in lines if not LOGFMT.match(line)]
    assert bad == [], bad[:5]


def test_a_flood_of_garbage_is_cut_to_a_few_lines_and_counted(fresh_rules: Rules) -> None:
    """On a service of its own: the fuzz above may log (httptools refuses some of its header values as not
    HTTP), and a rate-limit window it began would decide how much of the flood is written."""
    rules = fresh_rules
    for _ in range(200):  # no token needed to make uvicorn log "Invalid HTTP request received."
        assert raw_request(rules.port, b"\x16\x03\x01 not http\r\n\r\n") == 400
    assert rules.stop() == 0
    lines = rules.stderr().splitlines()
    bad = [line for line in lines if not LOGFMT.match(line)]
    assert bad == [], bad[:5]
    invalid = [line for line in lines if 'logger=uvicorn.error msg="Invalid HTTP request received."' in line]
    assert 0 < len(invalid) <= 10
    # the count of what was cut is written (here at exit, the flood being younger than a minute)
    summary = [line for line in lines if "repeated log lines suppressed" in line and "of_logger=uvicorn.error" in line]
    assert len(summary) == 1, lines[-5:]
    suppressed = int(re.search(r" suppressed=(\d+)", summary[0]).group(1))
    assert suppressed + len(invalid) >= 200
