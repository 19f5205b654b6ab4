"""The rules service's HTTP API under a real uvicorn on 127.0.0.1: every error path, and valid data kept alongside.

The app runs in-process (a uvicorn.Server on a thread, on a socket bound to port 0, so there is no
port race) with an injected clock, so rate limits and windows are deterministic and the stores can
be inspected directly. Raw sockets play the clients that lie about Content-Length or stream chunks.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpumond.config.rules import RulesConfig
from gpumond.rules.http import METRICS_TYPE, build_app
from gpumond.rules.ingest.stats import IngestStats
from gpumond.rules.store import RankStore
from gpumond.rules.types import Finding
from tests.fakes import FakeClock

pytestmark = pytest.mark.integration

TOKEN = "push-token-A-0123456789"
TOKEN_B = "push-token-B-0123456789"
NOW = 1_763_760_000.0
START_TIMEOUT_S = 10.0
HTTP_TIMEOUT_S = 5.0
LIMIT = 64 * 1024  # max_body_bytes in these tests


@dataclass
class Service:
    """One app under uvicorn on 127.0.0.1, plus what the test needs to steer and inspect it."""

    config: RulesConfig
    store: RankStore
    clock: FakeClock
    findings: list[Finding] = field(default_factory=list)
    ready: tuple[bool, str] = (True, "ready")
    port: int = 0
    server: uvicorn.Server | None = None
    thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=HTTP_TIMEOUT_S)

    def steps_held(self, job: str, rank: int) -> list[int]:
        ranks = self.store.jobs(self.clock()).get(job, {})
        return [s.step for s in ranks[rank].steps] if rank in ranks else []


def _metrics_text(stats: IngestStats) -> bytes:
    lines = []
    for s in stats.series():
        labels = ",".join(f'{k}="{v}"' for k, v in s.labels)
        lines.append(f"{s.name}{{{labels}}} {s.value:g}" if labels else f"{s.name} {s.value:g}")
    return ("\n".join(lines) + "\n").encode()


def _start(service: Service) -> Service:
    stats = IngestStats(service.store)
    app = build_app(config=service.config, rank_store=service.store, findings=lambda: service.findings,
                    metrics=lambda: _metrics_text(stats), ready=lambda: service.ready, clock=service.clock,
                    stats=stats)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    service.port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", log_config=None))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{service.port}",
                              daemon=True)
    service.server, service.thread = server, thread
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start on 127.0.0.1:{service.port} within {START_TIMEOUT_S:g} s")
        time.sleep(0.01)
    return service


def _stop(service: Service) -> None:
    assert service.server is not None and service.thread is not None
    service.server.should_exit = True
    service.thread.join(timeout=10)
    assert not service.thread.is_alive(), "uvicorn did not stop within 10 s"


@pytest.fixture
def serve() -> Iterator[Callable[..., Service]]:
    """`serve(**config)` starts the app with TOKEN and TOKEN_B accepted and these config keys set."""
    started: list[Service] = []

    def start(**overrides: Any) -> Service:
        data: dict[str, Any] = {"tokens": [TOKEN, TOKEN_B], "window_s": 600, "expire_after_s": 900}
        limits = {"max_body_bytes": LIMIT, **overrides.pop("limits", {})}
        data.update(overrides, limits=limits)
        config = RulesConfig.model_validate(data)
        service = Service(config, RankStore.from_config(config), FakeClock(NOW))
        started.append(service)
        return _start(service)

    yield start
    for service in started:
        _stop(service)


# ----- payloads ----------------------------------------------------------------------------------
def uuid(n: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{n:012x}"


def push(job: str = "llama", rank: int = 0, first: int = 0, count: int = 4, **over: Any) -> dict[str, Any]:
    body = {"job": job, "rank": rank, "world_size": 8, "node": f"node-{rank // 4}", "gpu_uuid": uuid(rank),
            "steps": [{"step": first + i, "end": NOW - count + i, "duration_s": 0.84, "data_wait_s": 0.02,
                       "samples": 32} for i in range(count)]}
    body.update(over)
    return body


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def post(client: httpx.Client, body: Any, token: str | None = TOKEN, **headers: str) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **(auth(token) if token else {}), **headers}
    return client.post("/api/v1/push", content=raw, headers=hdrs)


def error(response: httpx.Response) -> str:
    assert response.headers["content-type"] == "application/json"
    message = response.json()["error"]
    assert isinstance(message, str) and message and "\n" not in message
    return message


def raw_exchange(port: int, head: bytes, parts: list[bytes], read_after: int | None = None) -> bytes:
    """Send a request head and body parts on a raw socket; read the response (after part `read_after`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=HTTP_TIMEOUT_S) as s:
        s.sendall(head)
        for i, part in enumerate(parts):
            s.sendall(part)
            if read_after is not None and i == read_after:
                break
        chunks = []
        while True:
            try:
                data = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not data:
                break
            chunks.append(data)
            if b"\r\n\r\n" in b"".join(chunks) and _complete(b"".join(chunks)):
                break
        return b"".join(chunks)


def _complete(response: bytes) -> bool:
    head, _, body = response.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def status_and_json(response: bytes) -> tuple[int, dict[str, Any]]:
    """The first response on the wire (a lying client may get a second one, for its leftover bytes)."""
    head, _, body = response.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return int(head.split(b" ")[1]), json.loads(body[:length])


# ----- the happy path and the read API -----------------------------------------------------------
def test_a_push_is_accepted_stored_and_idempotent(serve) -> None:
    svc = serve()
    with svc.client() as c:
        r = post(c, push(count=5))
        assert (r.status_code, r.json()) == (202, {"accepted": 5})
        r = post(c, push(count=5))
        assert (r.status_code, r.json()) == (202, {"accepted": 0, "dropped": {"duplicate": 5}})
    assert svc.steps_held("llama", 0) == [0, 1, 2, 3, 4]


def test_findings_json_with_filters(serve) -> None:
    svc = serve()
    svc.findings = [
        Finding("straggler", "llama", "node-1", 5, uuid(5), 4.2, NOW - 60, "firing", {"sm_clock_ratio": 0.81}),
        Finding("io_starved_job", "llama", None, None, None, math.nan, NOW - 30, "pending", {"wait": math.inf}),
        Finding("straggler", "gpt", "node-9", 0, uuid(9), 3.1, NOW - 10, "pending"),
    ]
    with svc.client() as c:
        everything = c.get("/api/v1/findings").json()["findings"]
        assert [f["job"] for f in everything] == ["llama", "llama", "gpt"]
        assert everything[0] == {"kind": "straggler", "job": "llama", "node": "node-1", "rank": 5,
                                 "gpu_uuid": uuid(5), "score": 4.2, "since": NOW - 60, "state": "firing",
                                 "evidence": {"sm_clock_ratio": 0.81}}
        assert everything[1]["score"] is None and everything[1]["evidence"] == {"wait": None}
        assert len(c.get("/api/v1/findings", params={"job": "llama"}).json()["findings"]) == 2
        assert len(c.get("/api/v1/findings?kind=straggler&state=pending").json()["findings"]) == 1
        assert len(c.get("/api/v1/findings?job=gpt&job=llama&kind=straggler").json()["findings"]) == 2
        r = c.get("/api/v1/findings?state=resolved")
        assert r.status_code == 400 and error(r) == "state: must be one of pending, firing (got 'resolved')"
        r = c.get("/api/v1/findings?jobs=llama")
        assert r.status_code == 400 and error(r) == "unknown query parameter 'jobs' (use job, kind, state)"


def test_health_readiness_metrics_and_openapi(serve) -> None:
    svc = serve()
    with svc.client() as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").text == "ready\n"
        svc.ready = (False, "no telemetry fetched yet")
        r = c.get("/readyz")
        assert (r.status_code, r.text) == (503, "no telemetry fetched yet\n")
        post(c, push())
        post(c, push(), token=None)
        r = c.get("/metrics")
        assert r.headers["content-type"] == METRICS_TYPE
        assert 'gpumond_rules_push_requests_total{code="202"} 1' in r.text
        assert 'gpumond_rules_push_requests_total{code="401"} 1' in r.text
        spec = c.get("/api/v1/openapi.json").json()
        assert spec["openapi"].startswith("3.")
        assert set(spec["paths"]) == {"/api/v1/push", "/api/v1/findings"}
        push_schema = spec["components"]["schemas"]["Push"]
        assert push_schema["properties"]["steps"]["maxItems"] == svc.config.limits.max_steps_per_push
        assert {"400", "401", "413", "422", "429"} <= set(spec["paths"]["/api/v1/push"]["post"]["responses"])


def test_unknown_paths_and_methods_answer_json(serve) -> None:
    svc = serve()
    with svc.client() as c:
        r = c.get("/api/v2/push")
        assert r.status_code == 404 and "not found: /api/v2/push" in error(r)
        r = c.get("/api/v1/push")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert error(r) == "method GET not allowed on /api/v1/push"


# ----- every error path, with valid data before, after and alongside -----------------------------
@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b'{"job": "llama", "rank": ', 400, "invalid JSON: EOF while parsing a value at line 1 column 25"),
        (b"\x00\x01binary", 400, "invalid JSON: expected value at line 1 column 1"),
        ([push()], 422, "body: must be a JSON object"),
        ({**push(), "rank": "3"}, 422, "rank: must be a valid integer (got '3')"),
        (push(world_size=8.0), 422, "world_size: must be a valid integer"),
        (push(steps=[{"step": 1, "end": NOW, "duration_s": "fast", "data_wait_s": 0}]), 422,
         "steps[0].duration_s: must be a valid number (got 'fast')"),
        (push(steps=push()["steps"] + [{"step": 9, "end": NOW, "duration_s": -1, "data_wait_s": 0}]), 422,
         "steps[4].duration_s: must be at least 0 (got -1)"),
        (push(gpu_uuid="0"), 422, "gpu_uuid: must be an NVML GPU UUID"),
    ],
)
def test_bad_bodies_are_refused_with_a_message_and_valid_data_is_kept(serve, body: Any, status: int,
                                                                      message: str) -> None:
    svc = serve()
    with svc.client() as c:
        assert post(c, push(first=0, count=2)).status_code == 202
        r = post(c, body)
        assert r.status_code == status
        assert error(r).startswith(message), error(r)
        assert post(c, push(first=2, count=2)).status_code == 202
    assert svc.steps_held("llama", 0) == [0, 1, 2, 3]


def test_missing_and_wrong_tokens_are_401_with_a_bearer_challenge(serve) -> None:
    svc = serve()
    with svc.client() as c:
        r = post(c, push(), token=None)
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == 'Bearer realm="gpumond"'
        assert error(r) == "missing bearer token: send 'Authorization: Bearer <token>'"
        r = post(c, push(), token="push-token-C-0123456789")
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == 'Bearer realm="gpumond", error="invalid_token"'
        assert error(r) == "invalid bearer token"
        r = post(c, push(), token=None, Authorization=f"Basic {TOKEN}")
        assert r.status_code == 401 and error(r) == "Authorization must be 'Bearer <token>'"
        assert post(c, push(rank=1), token=TOKEN_B).status_code == 202
    assert svc.steps_held("llama", 0) == [] and svc.steps_held("llama", 1) == [0, 1, 2, 3]


def test_wrong_content_type_is_415(serve) -> None:
    svc = serve()
    with svc.client() as c:
        r = post(c, push(), **{"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 415 and error(r).startswith("Content-Type must be application/json")


def _head(length: int | None, token: str = TOKEN) -> bytes:
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (f"POST /api/v1/push HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\n{framing}\r\n\r\n").encode()


def test_an_oversize_body_is_refused_from_its_content_length_before_it_is_sent(serve) -> None:
    svc = serve()
    # Only the head is sent: the 413 must come without the server waiting for the 1 MiB body.
    response = raw_exchange(svc.port, _head(1_048_576), [])
    status, body = status_and_json(response)
    assert status == 413
    assert body == {"error": f"body larger than limits.max_body_bytes ({LIMIT} bytes)"}
    with svc.client() as c:
        big = push(steps=[{"step": i, "end": NOW, "duration_s": 1.0, "data_wait_s": 0.5, "samples": 1}
                          for i in range(1000)])
        r = post(c, big)  # an honest client sending the whole thing gets the same answer
        assert r.status_code == 413 and error(r) == body["error"]
        assert post(c, push()).status_code == 202
    assert svc.steps_held("llama", 0) == [0, 1, 2, 3]


def test_a_lying_content_length_reads_only_what_was_declared(serve) -> None:
    svc = serve()
    payload = json.dumps(push()).encode()
    # Declares 20 bytes, sends the whole push and then 200 KB more: only 20 bytes are read as the
    # body (an incomplete JSON document), the rest is never buffered as part of it.
    response = raw_exchange(svc.port, _head(20), [payload + b" " * 200_000], read_after=0)
    # Either the app answers the 20-byte body (h11 hands it over, then meets the rest as a bad next
    # request), or the HTTP parser rejects the stream at once (uvicorn's httptools protocol, which the service
    # serves with, parses the whole buffer first).
    # Both are 400 and neither reads past the declared length into the body.
    if b"Invalid HTTP request" in response:
        assert response.startswith(b"HTTP/1.1 400")
    else:
        status, body = status_and_json(response)
        assert status == 400 and body["error"].startswith("invalid JSON: EOF while parsing")
    with svc.client() as c:
        assert post(c, push()).status_code == 202
    assert svc.steps_held("llama", 0) == [0, 1, 2, 3]


def test_a_chunked_body_is_cut_off_as_soon_as_it_passes_the_limit(serve) -> None:
    svc = serve()
    chunk = b"[" + b" " * 8190 + b"]"  # 8 KiB of (useless) JSON per chunk
    parts = [f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" for _ in range(LIMIT // len(chunk) + 1)]
    # The terminating chunk is never sent: the answer must not wait for the end of the body.
    response = raw_exchange(svc.port, _head(None), parts, read_after=len(parts) - 1)
    status, body = status_and_json(response)
    assert status == 413 and body["error"].startswith("body larger than limits.max_body_bytes")
    # A chunked push under the limit is fine.
    payload = json.dumps(push(count=3)).encode()
    ok = raw_exchange(svc.port, _head(None), [f"{len(payload):x}\r\n".encode() + payload + b"\r\n0\r\n\r\n"])
    assert status_and_json(ok) == (202, {"accepted": 3})


def test_the_rate_limit_is_429_with_retry_after_and_other_clients_are_unaffected(serve) -> None:
    svc = serve(limits={"pushes_per_second_per_client": 0.5, "burst": 3})
    with svc.client() as c:
        for k in range(3):
            assert post(c, push(first=k * 4)).status_code == 202
        r = post(c, push(first=12))
        assert r.status_code == 429 and r.headers["retry-after"] == "2"
        assert error(r) == "rate limit: more than 0.5 pushes/s (burst 3) from this client; retry after 2 s"
        assert post(c, push(rank=1), token=TOKEN_B).status_code == 202  # another token: another client
        svc.clock.now += 2
        assert post(c, push(first=12)).status_code == 202
    assert svc.steps_held("llama", 0) == list(range(16))
    assert svc.steps_held("llama", 1) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("limits", "new", "message"),
    [
        ({"max_jobs": 2}, push(job="job-c"), "jobs cap reached: 2 jobs held (limits.max_jobs); new job 'job-c'"),
        ({"max_ranks": 2}, push(job="job-a", rank=3), "ranks cap reached: 2 ranks held (limits.max_ranks)"),
        ({"max_gpus": 2}, push(job="job-a", rank=1, gpu_uuid=uuid(77)),
         f"gpus cap reached: 2 gpus held (limits.max_gpus); new GPU {uuid(77)} refused"),
    ],
)
def test_a_cardinality_cap_is_429_naming_it_and_held_series_keep_working(serve, limits: dict, new: dict,
                                                                         message: str) -> None:
    svc = serve(limits=limits)
    with svc.client() as c:
        assert post(c, push(job="job-a", rank=0)).status_code == 202
        assert post(c, push(job="job-b", rank=0, gpu_uuid=uuid(1))).status_code == 202
        r = post(c, new)
        assert r.status_code == 429 and error(r).startswith(message), error(r)
        assert r.json()["cap"] == next(iter(limits)).removeprefix("max_") and r.headers["retry-after"] == "30"
        assert post(c, push(job="job-a", rank=0, first=4)).status_code == 202
        assert post(c, push(job="job-b", rank=0, first=4, gpu_uuid=uuid(1))).status_code == 202
        cap = next(iter(limits)).removeprefix("max_")
        assert f'gpumond_rules_cap_refusals_total{{cap="{cap}"}} 1' in c.get("/metrics").text
    assert svc.steps_held("job-a", 0) == list(range(8)) and svc.steps_held("job-b", 0) == list(range(8))


def test_steps_from_the_future_are_refused(serve) -> None:
    svc = serve()
    with svc.client() as c:
        future = push(steps=[{"step": 1, "end": NOW + 7200, "duration_s": 1, "data_wait_s": 0}])
        r = post(c, future)
        assert r.status_code == 422 and error(r).startswith("steps[0].end: 7200 s in the future")


# ----- fuzzing: whatever arrives, no 5xx, and every 4xx says why ---------------------------------
_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                       st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40))
_json = st.recursive(_json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                     max_leaves=12)
_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), min_size=1, max_size=20)


@st.composite
def _step(draw: st.DrawFn) -> dict[str, Any]:
    duration = draw(st.floats(0, 100))
    step = {"step": draw(st.integers(0, 2**63 - 1)), "end": draw(st.floats(NOW - 900, NOW + 900)),
            "duration_s": duration, "data_wait_s": duration * draw(st.floats(0, 1))}
    if draw(st.booleans()):
        step["samples"] = draw(st.one_of(st.none(), st.integers(0, 1000)))
    return step


@st.composite
def _push(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly valid pushes (the service's limits and caps still refuse some)."""
    rank = draw(st.integers(0, 70))
    body = {"job": draw(_text), "rank": rank, "world_size": rank + draw(st.integers(1, 8)), "node": draw(_text),
            "gpu_uuid": uuid(draw(st.integers(0, 100))), "steps": draw(st.lists(_step(), max_size=6))}
    if draw(st.booleans()):
        body["group"] = draw(st.one_of(st.none(), _text))
    return body


@st.composite
def _mutated(draw: st.DrawFn) -> dict[str, Any]:
    body = draw(_push())
    key = draw(st.sampled_from([*body, "steps.0", "extra"]))
    if key == "steps.0" and body["steps"]:
        body["steps"][0][draw(st.sampled_from(list(body["steps"][0])))] = draw(_json)
    else:
        body[key] = draw(_json)
    return body


_bodies = st.one_of(
    _push().map(lambda b: json.dumps(b).encode()),
    _mutated().map(lambda b: json.dumps(b).encode()),
    _json.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=300),
    _push().map(lambda b: json.dumps(b).encode()[: len(json.dumps(b)) // 2]),
)
_headers = st.fixed_dictionaries({}, optional={
    "Authorization": st.one_of(st.just(f"Bearer {TOKEN}"), st.text(max_size=30).map(lambda t: f"Bearer {t}"),
                               st.sampled_from(["", "Basic x", "bearer"])),
    "Content-Type": st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain"]),
    "Content-Encoding": st.sampled_from(["identity", "identity", "gzip"]),
})


def _latin1(headers: dict[str, str]) -> dict[str, str]:
    # HTTP header values are bytes on the wire; keep the ones httpx can send.
    return {k: v for k, v in headers.items() if v.isascii() and v.isprintable() and v == v.strip()}


@pytest.fixture(scope="module")
def fuzz_service() -> Iterator[Service]:
    config = RulesConfig.model_validate({"tokens": [TOKEN], "window_s": 600, "limits": {
        "max_body_bytes": LIMIT, "pushes_per_second_per_client": 1e6, "burst": 1_000_000,
        "max_jobs": 20, "max_ranks": 100, "max_gpus": 50}})
    service = _start(Service(config, RankStore.from_config(config), FakeClock(NOW)))
    yield service
    _stop(service)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(body=_bodies, headers=_headers)
def test_fuzzed_pushes_never_get_a_5xx_and_a_429_names_its_cap(fuzz_service: Service, body: bytes,
                                                            headers: dict[str, str]) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json", **_latin1(headers)}
    with fuzz_service.client() as c:
        r = c.post("/api/v1/push", content=body, headers=headers)
    event(f"status {r.status_code}")  # shown by --hypothesis-show-statistics
    if r.status_code == 202:
        assert isinstance(r.json()["accepted"], int)
        return
    assert r.status_code in (400, 401, 413, 415, 422, 429), (r.status_code, r.text)
    message = error(r)
    if r.status_code == 429:  # the rate limit is out of reach here (1e6/s): only a cap answers 429
        assert "cap reached" in message and r.json()["cap"] in ("jobs", "ranks", "gpus", "steps")


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(params=st.lists(st.tuples(st.sampled_from(["job", "kind", "state", "x", "job[]"]), st.text(max_size=20)),
                       max_size=4))
def test_fuzzed_findings_queries_are_200_or_a_named_400(fuzz_service: Service, params: list) -> None:
    with fuzz_service.client() as c:
        r = c.get("/api/v1/findings", params=params)
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        error(r)
    else:
        assert r.json() == {"findings": []}
