"""PrometheusSource: the pure join on synthetic query results, and HTTP failures against a fake API."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpumond.rules.telemetry import PrometheusSource, Row, build_queries, join, signals
from gpumond.rules.telemetry.promql import vector_rows
from gpumond.rules.telemetry.promql_join import IDENTITY, TARGETS

A = {"job": "gpumond", "instance": "10.0.0.1:9480"}
B = {"job": "gpumond", "instance": "10.0.0.2:9480"}


def _info(target: Mapping[str, str], uuid: str, gpu: str, hostname: str | None = "n", **extra: str) -> Row:
    labels = {**target, "uuid": uuid, "gpu": gpu, **extra}
    if hostname:
        labels["hostname"] = hostname
    return Row(labels, 1.0)


def _gpu(target: Mapping[str, str], uuid: str, gpu: str, value: float, **extra: str) -> Row:
    return Row({**target, "uuid": uuid, "gpu": gpu, **extra}, value)


def _results(**over: list[Row]) -> dict[str, list[Row]]:
    """Two healthy targets: node-a (GPUs a0, a1) and node-b (GPU b0)."""
    base: dict[str, list[Row]] = {
        IDENTITY: [_info(A, "a0", "0", "node-a"), _info(A, "a1", "1", "node-a"), _info(B, "b0", "0", "node-b")],
        TARGETS: [Row(A, 1.0), Row(B, 1.0)],
        signals.GPU_UP: [_gpu(A, "a0", "0", 1), _gpu(A, "a1", "1", 0), _gpu(B, "b0", "0", 1)],
        signals.JOB_INFO: [_gpu(A, "a0", "0", 1, job="j1"), _gpu(B, "b0", "0", 1, job="j1")],
        "gpumond_gpu_power_watts": [_gpu(A, "a0", "0", 650.0), _gpu(B, "b0", "0", 400.0)],
        "gpumond_gpu_clocks_event_active": [_gpu(A, "a0", "0", 1.0, reason="sw_power_cap"),
                                            _gpu(B, "b0", "0", 0.0, reason="hw_thermal_slowdown")],
        "gpumond_host_cpu_iowait_ratio": [Row(A, 0.1), Row(B, 0.6)],
    }
    return {**base, **over}


def test_join_by_uuid_with_node_from_hostname() -> None:
    j = join(_results(), t=50.0)
    assert [(g.uuid, g.node, g.gpu, g.up, dict(g.values), g.jobs, g.t) for g in j.gpus] == [
        ("a0", "node-a", "0", True, {"power_w": 650.0, "throttle_sw_power_cap": 1.0}, ("j1",), 50.0),
        ("a1", "node-a", "1", False, {}, (), 50.0),
        ("b0", "node-b", "0", True, {"power_w": 400.0, "throttle_hw_thermal": 0.0}, ("j1",), 50.0),
    ]
    assert [(h.node, dict(h.values)) for h in j.hosts] == [("node-a", {"cpu_iowait": 0.1}),
                                                          ("node-b", {"cpu_iowait": 0.6})]
    assert j.absent_nodes == frozenset()


def test_gpu_values_need_only_the_labels_the_lean_queries_keep() -> None:
    # build_queries aggregates GPU values `by (uuid[, selecting label])`: the join must read them the same.
    keep = {"uuid", "reason", "precision", "type"}
    lean = {m: [Row({k: v for k, v in r.labels.items() if k in keep}, r.value) for r in rows]
            for m, rows in _results().items() if m in {m for m, _ in signals.GPU_SERIES.values()}}
    assert join(_results(**lean), t=50.0) == join(_results(), t=50.0)


def test_a_down_target_makes_its_node_absent_and_its_gpus_disappear() -> None:
    # Prometheus writes up=0 and stale markers: only the remembered identity names the node.
    j = join(_results(**{TARGETS: [Row(A, 0.0), Row(B, 1.0)],
                         signals.GPU_UP: [_gpu(B, "b0", "0", 1)],
                         "gpumond_host_cpu_iowait_ratio": [Row(B, 0.6)]}), t=1.0)
    assert [g.uuid for g in j.gpus] == ["b0"]
    assert j.absent_nodes == {"node-a"}
    assert [h.node for h in j.hosts] == ["node-b"]


def test_up_zero_wins_over_series_not_yet_stale() -> None:
    # VictoriaMetrics or a slow staleness pass may still return values for a moment.
    j = join(_results(**{TARGETS: [Row(A, 0.0), Row(B, 1.0)]}), t=1.0)
    assert [g.uuid for g in j.gpus] == ["b0"] and j.absent_nodes == {"node-a"}


def test_without_up_series_freshness_decides() -> None:
    # Remote-write pipelines may drop `up`: a target with a fresh gpumond_gpu_up is present, else absent.
    j = join(_results(**{TARGETS: [], signals.GPU_UP: [_gpu(B, "b0", "0", 1)]}), t=1.0)
    assert [g.uuid for g in j.gpus] == ["b0"] and j.absent_nodes == {"node-a"}
    results = _results()
    del results[TARGETS]  # the `up` query failed outright
    assert [g.uuid for g in join(results, t=1.0).gpus] == ["a0", "a1", "b0"]


def test_a_gpu_gone_stale_on_a_live_target_is_left_out() -> None:
    j = join(_results(**{signals.GPU_UP: [_gpu(A, "a0", "0", 1), _gpu(B, "b0", "0", 1)]}), t=1.0)
    assert [g.uuid for g in j.gpus] == ["a0", "b0"] and j.absent_nodes == frozenset()


def test_node_label_then_hostname_then_instance_host() -> None:
    # A `node` label on a target (e.g. from Prometheus' own file_sd) is on every series of that target.
    rack = {**A, "node": "rack1-a"}
    j = join(_results(**{IDENTITY: [_info(rack, "a0", "0", "node-a"), _info(rack, "a1", "1", "node-a"),
                                    _info(B, "b0", "0", None)]}), t=1.0)
    assert {g.uuid: g.node for g in j.gpus} == {"a0": "rack1-a", "a1": "rack1-a", "b0": "10.0.0.2"}
    assert {h.node for h in j.hosts} == {"rack1-a", "10.0.0.2"}  # host rows join by target, not by label
    j = join(_results(**{IDENTITY: [], TARGETS: []}), t=1.0)  # identities lost: fall back to gpu_up rows
    assert {g.uuid: g.node for g in j.gpus} == {"a0": "10.0.0.1", "a1": "10.0.0.1", "b0": "10.0.0.2"}


def test_duplicate_uuids_from_two_jobs_resolve_deterministically() -> None:
    twin = {"job": "another", "instance": "10.0.0.1:9480"}
    rows = [_info(twin, "a0", "0", "node-a"), *_results()[IDENTITY]]
    for order in (rows, list(reversed(rows))):
        j = join(_results(**{IDENTITY: order, TARGETS: [Row(A, 1.0), Row(B, 1.0), Row(twin, 1.0)]}), t=1.0)
        assert [g.uuid for g in j.gpus] == ["a0", "a1", "b0"]


def test_queries_are_one_per_metric_and_cover_every_signal() -> None:
    q = build_queries(120)
    assert q[IDENTITY] == "last_over_time(gpumond_gpu_info[120s])"
    assert q[TARGETS] == "up and on (job, instance) last_over_time(gpumond_gpu_info[120s])"
    metrics = {m for m, _ in signals.GPU_SERIES.values()} | set(signals.HOST_SERIES.values())
    assert metrics | {IDENTITY, TARGETS, signals.GPU_UP, signals.JOB_INFO, signals.MIG_INFO,
                      signals.ALERT_ACTIVE, signals.CLOCKS_EVENT_MASK} == set(q)
    selected = [(m, v) for m, v in signals.GPU_SERIES.values() if v]
    assert all(f'{signals.SELECTOR_LABEL[m]}=~"' in q[m] and v in q[m] for m, v in selected)
    assert "gpu_idle" not in q[signals.CLOCKS_EVENT]
    # GPU values come back with only the labels the join reads (uuid and the selecting label).
    assert q[signals.TENSOR_ACTIVE] == 'max by (uuid, precision) (gpumond_gpu_tensor_active_ratio{precision=~"any"})'
    assert q["gpumond_gpu_power_watts"] == "max by (uuid) (gpumond_gpu_power_watts)"
    assert q[signals.CLOCKS_EVENT].startswith("max by (uuid, reason) (gpumond_gpu_clocks_event_active{reason=~")
    assert q[signals.NVLINK_ERRORS] == 'gpumond_gpu_nvlink_errors_total{type=~"replay"}'
    assert q[signals.CLOCKS_EVENT_MASK] == "max by (uuid) (gpumond_gpu_clocks_event_reasons_bitmask)"


# ----- over HTTP ---------------------------------------------------------------------------------
Responder = Callable[[str], tuple[int, object]]


class FakePrometheus:
    """/api/v1/query on 127.0.0.1; `respond(query) -> (status, JSON-able or bytes)` decides each answer."""

    def __init__(self, respond: Responder) -> None:
        self.respond = respond
        self.params: list[dict[str, str]] = []
        self.release = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urllib.parse.urlsplit(self.path)
                params = dict(urllib.parse.parse_qsl(parts.query))
                fake.params.append({"path": parts.path, **params})
                status, payload = fake.respond(params.get("query", ""))
                if payload == "hang":
                    fake.release.wait(5.0)
                    return
                body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _vector(rows: list[Row]) -> dict[str, object]:
    return {"status": "success", "data": {"resultType": "vector",
                                          "result": [{"metric": dict(r.labels), "value": [1.0, repr(r.value)]}
                                                     for r in rows]}}


def _healthy(query: str) -> tuple[int, object]:
    by_query = {q: _results().get(key, []) for key, q in build_queries(300).items()}
    return 200, _vector(by_query[query])


@pytest.fixture
def serve() -> Iterator[Callable[[Responder], FakePrometheus]]:
    made: list[FakePrometheus] = []

    def start(respond: Responder) -> FakePrometheus:
        made.append(FakePrometheus(respond))
        return made[-1]

    yield start
    for p in made:
        p.close()


def _source(url: str, **kw: object) -> PrometheusSource:
    kw.setdefault("timeout_s", 0.5)
    return PrometheusSource(url, clock=lambda: 1700000000.25, **kw)  # type: ignore[arg-type]


def test_fetch_queries_every_metric_at_one_instant(serve) -> None:
    prom = serve(_healthy)
    src = _source(prom.url + "/")
    try:
        batch = src.fetch()
    finally:
        src.close()
    assert batch.errors == () and batch.t == 1700000000.25
    assert [g.uuid for g in batch.gpus] == ["a0", "a1", "b0"]
    assert len(prom.params) == len(build_queries(300))
    assert {p["path"] for p in prom.params} == {"/api/v1/query"}
    assert {p["time"] for p in prom.params} == {"1700000000.250"}
    assert {p["nocache"] for p in prom.params} == {"1"}


@pytest.mark.parametrize(("answer", "message"), [
    ((500, b"upstream exploded"), "HTTP 500: response is not JSON: upstream exploded"),
    ((400, {"status": "error", "errorType": "bad_data", "error": "parse error"}), "HTTP 400: bad_data: parse error"),
    ((200, {"status": "success", "data": {"resultType": "matrix", "result": []}}), "expected an instant vector"),
    ((200, {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}}),
     "malformed result"),
    ((200, "hang"), "timed out after 0.5s"),
])
def test_a_failing_signal_query_is_an_error_line_and_the_rest_still_joins(serve, answer, message) -> None:
    power = build_queries(300)["gpumond_gpu_power_watts"]
    prom = serve(lambda q: answer if q == power else _healthy(q))
    src = _source(prom.url)
    started = time.monotonic()
    try:
        batch = src.fetch()
    finally:
        src.close()
    assert time.monotonic() - started < 2.0
    assert len(batch.errors) == 1 and batch.errors[0].startswith(f"prometheus {power}: ")
    assert message in batch.errors[0], batch.errors
    a0 = batch.gpus[0]
    assert "power_w" not in a0.values and a0.values["throttle_sw_power_cap"] == 1.0


def test_without_identities_nothing_is_claimed_absent(serve) -> None:
    identity = build_queries(300)[IDENTITY]
    prom = serve(lambda q: (503, b"") if q == identity else _healthy(q))
    src = _source(prom.url)
    try:
        batch = src.fetch()
    finally:
        src.close()
    assert (batch.gpus, batch.hosts, batch.absent_nodes) == ((), (), frozenset())
    assert len(batch.errors) == 1 and "HTTP 503" in batch.errors[0]


def test_an_unreachable_server_is_errors_not_an_exception() -> None:
    src = _source("http://127.0.0.1:9", timeout_s=0.5)
    try:
        batch = src.fetch()
    finally:
        src.close()
    assert batch.gpus == () and len(batch.errors) == len(build_queries(300))
    assert all("ConnectError" in e for e in batch.errors)


def test_agent_alerts_are_named_by_node_and_lose_target_labels() -> None:
    from gpumond.rules.telemetry.promql_join import agent_alerts

    rows = [Row({"__name__": "gpumond_alert_active", "job": "gpumond", "instance": "10.0.0.1:9480", "node": "node-a",
                 "alertname": "GpuXidCritical", "gpu": "3", "xid": "79", "severity": "critical"}, 1.0),
            Row({"job": "gpumond", "instance": "10.0.0.2:9480", "alertname": "GpuLost", "gpu": "0"}, 0.0)]
    (a,) = agent_alerts(rows)
    assert a.node == "node-a" and dict(a.labels) == {"node": "node-a", "alertname": "GpuXidCritical", "gpu": "3",
                                                     "xid": "79", "severity": "critical"}


def _answer(result: object, status: str = "success", kind: str = "vector") -> bytes:
    return json.dumps({"status": status, "data": {"resultType": kind, "result": result}}).encode()


LOADERS = [pytest.param(json.loads, id="json")]
try:
    import orjson

    LOADERS.append(pytest.param(orjson.loads, id="orjson"))
except ImportError:  # the optional fast path is not installed: the stdlib reference alone
    pass


@pytest.mark.parametrize("loads", LOADERS)
def test_vector_rows_reads_series_and_skips_non_finite_values_with_either_decoder(loads) -> None:
    series = [{"metric": {"uuid": "GPU-a", "gpu": "0"}, "value": [1.0, "12.5"]},
              {"metric": {"uuid": "GPU-b"}, "value": [1.0, "NaN"]},
              {"metric": {"uuid": "GPU-c"}, "value": [1.0, "+Inf"]},
              {"metric": {}, "value": [1.0, "3"]}]
    assert vector_rows(200, _answer(series), loads) == [Row({"uuid": "GPU-a", "gpu": "0"}, 12.5), Row({}, 3.0)]


@pytest.mark.parametrize("loads", LOADERS)
@pytest.mark.parametrize(("status", "body", "message"), [
    (200, b"<html>", "HTTP 200: response is not JSON: <html>"),
    (200, b"[1]", "HTTP 200: response is not a JSON object"),
    (422, b'{"status":"error","errorType":"execution","error":"too many series"}',
     "HTTP 422: execution: too many series"),
    (200, _answer([], kind="matrix"), "expected an instant vector, got 'matrix'"),
    (200, _answer([{"metric": {"a": "b"}}]), "malformed result: KeyError: 'value'"),
    (200, _answer([{"metric": 7, "value": [1, "1"]}]), "malformed result: TypeError"),
    (200, _answer([{"metric": {}, "value": [1, "x"]}]), "malformed result: ValueError"),
])
def test_vector_rows_says_in_one_line_why_an_answer_has_no_rows(loads, status, body, message) -> None:
    got = vector_rows(status, body, loads)
    assert isinstance(got, str) and got.startswith(message) and "\n" not in got


# ----- tiers: what changes rarely is asked in full once per refresh ---------------------------------------
class World:
    """What a Prometheus holds now (by join key, as _results), answering full and narrowed queries alike."""

    def __init__(self) -> None:
        self.rows = _results(**{signals.MIG_INFO: [],
                                "gpumond_gpu_power_limit_watts": [_gpu(A, "a0", "0", 700.0), _gpu(B, "b0", "0", 500.0)],
                                "gpumond_gpu_sm_clock_max_hertz": [_gpu(A, "a0", "0", 2e9), _gpu(B, "b0", "0", 2e9)]})
        self.by_query = {q: key for key, q in build_queries(300).items()}
        self.failing: set[str] = set()

    def respond(self, query: str) -> tuple[int, object]:
        if query in self.failing:
            return 503, b"unavailable"
        if query.startswith("up{job=~"):  # between refreshes: `up` of the identity's jobs
            assert query == 'up{job=~"gpumond"}'
            return 200, _vector(self.rows[TARGETS])
        if query.endswith(" != 0"):  # between refreshes: the active throttle reasons only
            return 200, _vector([r for r in self.rows.get(self.by_query[query.removesuffix(" != 0")], [])
                                 if r.value != 0])
        return 200, _vector(self.rows.get(self.by_query[query], []))


def _fetch_at(url: str, t: float, **kw: object) -> tuple[PrometheusSource, Callable[[float], object]]:
    clock = [t]
    src = PrometheusSource(url, timeout_s=0.5, clock=lambda: clock[0], **kw)  # type: ignore[arg-type]

    def at(when: float) -> object:
        clock[0] = when
        return src.fetch()
    return src, at


def _full_fetch(url: str, t: float):
    src, at = _fetch_at(url, t, refresh_s=0)  # every query in full, every fetch: the reference
    try:
        return at(t)
    finally:
        src.close()


def test_between_refreshes_rare_signals_are_reused_and_the_result_is_what_a_full_fetch_gives(serve) -> None:
    world = World()
    prom = serve(world.respond)
    src, at = _fetch_at(prom.url, 1000.0, refresh_s=60)
    full = build_queries(300)
    try:
        first = at(1000.0)
        asked_first = [p["query"] for p in prom.params]
        del prom.params[:]
        second = at(1010.0)
        asked_second = [p["query"] for p in prom.params]
        del prom.params[:]
        at(1060.0)  # refresh_s after the refresh: everything in full again
        asked_third = [p["query"] for p in prom.params]
    finally:
        src.close()
    assert sorted(asked_first) == sorted(full.values()) == sorted(asked_third)
    reused = {full[k] for k in (IDENTITY, signals.MIG_INFO, "gpumond_gpu_sm_clock_max_hertz",
                                "gpumond_gpu_power_limit_watts")}
    # These agents export no throttle bitmask: the per-reason series are asked too, the active ones in between.
    assert sorted(asked_second) == sorted([q for k, q in full.items() if q not in reused and
                                           k not in (TARGETS, signals.CLOCKS_EVENT, signals.CLOCKS_EVENT_MASK)]
                                          + ['up{job=~"gpumond"}', f"{full[signals.CLOCKS_EVENT]} != 0",
                                             f"{full[signals.CLOCKS_EVENT_MASK]} != 0"])
    assert first.errors == second.errors == ()
    reference = _full_fetch(prom.url, 1010.0)
    assert (second.gpus, second.hosts, second.absent_nodes) == (reference.gpus, reference.hosts,
                                                                reference.absent_nodes)
    assert dict(second.gpus[0].values) == {"power_w": 650.0, "power_limit_w": 700.0, "sm_clock_max_hz": 2e9,
                                           "throttle_sw_power_cap": 1.0}


def test_between_refreshes_throttle_changes_and_down_targets_are_seen_at_the_next_fetch(serve) -> None:
    world = World()
    prom = serve(world.respond)
    src, at = _fetch_at(prom.url, 1000.0, refresh_s=60)
    try:
        at(1000.0)
        world.rows["gpumond_gpu_clocks_event_active"] = [  # a0's reason ends, b0's starts
            _gpu(A, "a0", "0", 0.0, reason="sw_power_cap"), _gpu(B, "b0", "0", 1.0, reason="hw_thermal_slowdown")]
        world.rows[TARGETS] = [Row(A, 1.0), Row(B, 0.0)]  # node-b's agent stops answering
        world.rows[signals.GPU_UP] = [r for r in world.rows[signals.GPU_UP] if r.labels["uuid"] != "b0"]
        changed = at(1010.0)
    finally:
        src.close()
    assert changed.gpus[0].values["throttle_sw_power_cap"] == 0.0
    assert changed.absent_nodes == {"node-b"} and [g.uuid for g in changed.gpus] == ["a0", "a1"]
    reference = _full_fetch(prom.url, 1010.0)
    assert (changed.gpus, changed.absent_nodes) == (reference.gpus, reference.absent_nodes)
    # b0 is absent, but its throttle reason, which the refresh knew, reads active on the next full answer too.
    world.rows[TARGETS] = [Row(A, 1.0), Row(B, 1.0)]
    world.rows[signals.GPU_UP] = _results()[signals.GPU_UP]
    src, at = _fetch_at(prom.url, 1000.0, refresh_s=60)
    try:
        at(1000.0)
        world.rows["gpumond_gpu_clocks_event_active"].append(_gpu(B, "b0", "0", 1.0, reason="sw_power_cap"))
        new_reason = at(1010.0)  # a series the refresh did not see, active: taken as it comes
    finally:
        src.close()
    assert new_reason.gpus[2].values == {"power_w": 400.0, "power_limit_w": 500.0, "sm_clock_max_hz": 2e9,
                                         "throttle_hw_thermal": 1.0, "throttle_sw_power_cap": 1.0}


def test_a_failed_refresh_is_reported_reuses_nothing_and_is_asked_again(serve) -> None:
    world = World()
    prom = serve(world.respond)
    limit = build_queries(300)["gpumond_gpu_power_limit_watts"]
    src, at = _fetch_at(prom.url, 1000.0, refresh_s=60)
    try:
        assert at(1000.0).gpus[0].values["power_limit_w"] == 700.0
        at(1060.0)  # the next refresh …
        world.failing.add(limit)
        del prom.params[:]
        failed = at(1120.0)  # … and the one after fails: the error, and no power limit from an old answer
        assert [p["query"] for p in prom.params].count(limit) == 1
        assert len(failed.errors) == 1 and failed.errors[0].startswith(f"prometheus {limit}: HTTP 503")
        assert "power_limit_w" not in failed.gpus[0].values
        world.failing.clear()
        del prom.params[:]
        again = at(1130.0)  # asked again at once, not a refresh_s later
    finally:
        src.close()
    assert [p["query"] for p in prom.params].count(limit) == 1
    assert again.errors == () and again.gpus[0].values["power_limit_w"] == 700.0


def test_a_clock_that_goes_back_refreshes(serve) -> None:
    world = World()
    prom = serve(world.respond)
    src, at = _fetch_at(prom.url, 1000.0, refresh_s=60)
    try:
        at(1000.0)
        del prom.params[:]
        at(990.0)
    finally:
        src.close()
    assert sorted(p["query"] for p in prom.params) == sorted(build_queries(300).values())


def test_up_of_the_identity_jobs_matches_job_names_literally() -> None:
    from gpumond.rules.telemetry.promql_tiers import Tiers

    full = build_queries(300)
    tiers = Tiers(full, 60)
    ident = [Row({"job": 'gpu.nodes|"x"\\', "uuid": "u"}, 1.0), Row({"job": "agents", "uuid": "v"}, 1.0)]
    tiers.merge(tiers.plan(5.0), {IDENTITY: ident, TARGETS: []}, 5.0)
    query = tiers.plan(6.0)[TARGETS]
    assert query.startswith('up{job=~"') and query.endswith('"}')
    pattern = json.loads(query[len("up{job=~"):-1])  # PromQL's string escapes (\\ and \") are JSON's
    names = ['gpu.nodes|"x"\\', "agents", "gpuxnodes", "gpu", '"x"\\', "agent"]
    assert [j for j in names if re.fullmatch(pattern, j)] == ['gpu.nodes|"x"\\', "agents"]
    with pytest.raises(ValueError, match="refresh_s"):
        Tiers(full, -1)


def test_a_gpu_the_refresh_did_not_know_makes_the_next_fetch_a_refresh(serve) -> None:
    world = World()
    prom = serve(world.respond)
    src, at = _fetch_at(prom.url, 1000.0, refresh_s=60)
    try:
        at(1000.0)
        world.rows[IDENTITY].append(_info(B, "b1", "1", "node-b"))
        world.rows[signals.GPU_UP].append(_gpu(B, "b1", "1", 1))
        world.rows["gpumond_gpu_power_limit_watts"].append(_gpu(B, "b1", "1", 500.0))
        world.rows["gpumond_gpu_sm_clock_max_hertz"].append(_gpu(B, "b1", "1", 2e9))
        world.rows["gpumond_gpu_clocks_event_active"].append(_gpu(B, "b1", "1", 0.0, reason="hw_slowdown"))
        joined = at(1010.0)  # b1 is there (from its fresh series), without the rarely asked signals …
        del prom.params[:]
        known = at(1020.0)  # … which the next fetch, a refresh, asks
    finally:
        src.close()
    assert [g.values for g in joined.gpus if g.uuid == "b1"] == [{}]
    assert sorted(p["query"] for p in prom.params) == sorted(build_queries(300).values())
    assert [g.values for g in known.gpus if g.uuid == "b1"] == [{"power_limit_w": 500.0, "sm_clock_max_hz": 2e9,
                                                                 "throttle_hw_slowdown": 0.0}]


def test_a_live_gpu_missing_from_a_refresh_answer_makes_the_next_fetch_a_refresh_too(serve) -> None:
    # A server that had not yet indexed every series when the refresh asked (VictoriaMetrics shows a new series
    # ~10 s after it is written): the next fetch asks again rather than reuse the gap until the next refresh.
    world = World()
    world.rows["gpumond_gpu_sm_clock_max_hertz"].pop()  # b0's
    prom = serve(world.respond)
    src, at = _fetch_at(prom.url, 1000.0, refresh_s=60)
    try:
        assert "sm_clock_max_hz" not in at(1000.0).gpus[2].values
        world.rows["gpumond_gpu_sm_clock_max_hertz"].append(_gpu(B, "b0", "0", 2e9))
        del prom.params[:]
        seen = at(1010.0)
    finally:
        src.close()
    assert sorted(p["query"] for p in prom.params) == sorted(build_queries(300).values())
    assert seen.gpus[2].values["sm_clock_max_hz"] == 2e9


# ----- the throttle reasons as one bitmask series per GPU -------------------------------------------------------
def _masked(world: World, *, skip: tuple[str, ...] = ()) -> World:
    """The world's agents export the bitmask too (but for the GPUs in `skip`): the same reasons as the per-reason
    series, as NVML's bits."""
    bits: dict[str, int] = {}
    labels: dict[str, dict[str, str]] = {}
    for r in world.rows[signals.GPU_UP]:
        bits.setdefault(r.labels["uuid"], 0)
        labels[r.labels["uuid"]] = {k: v for k, v in r.labels.items()}
    for r in world.rows[signals.CLOCKS_EVENT]:
        if r.value:
            bits[r.labels["uuid"]] |= signals.REASON_BITS[r.labels["reason"]]
    world.rows[signals.CLOCKS_EVENT_MASK] = [Row(labels[u], float(m)) for u, m in bits.items() if u not in skip]
    return world


def _asked(prom: FakePrometheus) -> list[str]:
    out = [p["query"] for p in prom.params]
    del prom.params[:]
    return out


def test_the_bitmask_replaces_the_per_reason_series_once_every_live_gpu_has_one(serve) -> None:
    world = _masked(World())
    prom = serve(world.respond)
    full = build_queries(300)
    per_reason, mask = full[signals.CLOCKS_EVENT], full[signals.CLOCKS_EVENT_MASK]
    src, at = _fetch_at(prom.url, 1000.0, refresh_s=60)
    try:
        first = at(1000.0)  # the first fetch cannot know: both, in full
        assert per_reason in _asked(prom)
        second = at(1010.0)
        asked = _asked(prom)
        assert f"{mask} != 0" in asked and not [q for q in asked if q.startswith(per_reason)]
        assert first.gpus == _full_fetch(prom.url, 1000.0).gpus and second.gpus == _full_fetch(prom.url, 1010.0).gpus
        assert second.gpus[0].values["throttle_sw_power_cap"] == 1.0  # a0's, from its bitmask 0x4
        # b0 starts hw_slowdown, a0's power cap ends: the bitmask says so (the per-reason series are not asked).
        world.rows[signals.CLOCKS_EVENT] = [_gpu(A, "a0", "0", 0.0, reason="sw_power_cap"),
                                            _gpu(B, "b0", "0", 1.0, reason="hw_slowdown")]
        _masked(world)
        _asked(prom)  # (the reference fetches above asked everything)
        changed = at(1020.0)
        assert f"{mask} != 0" in _asked(prom)
        refreshed = at(1060.0)  # a refresh asks the bitmask in full, and still not the per-reason series
        asked = _asked(prom)
        assert mask in asked and per_reason not in asked
    finally:
        src.close()
    assert changed.gpus[0].values["throttle_sw_power_cap"] == 0.0
    assert changed.gpus[2].values["throttle_hw_slowdown"] == 1.0
    assert changed.gpus == _full_fetch(prom.url, 1020.0).gpus
    assert refreshed.gpus == _full_fetch(prom.url, 1060.0).gpus
    # Every reason the signals map, from the bitmask, for every GPU that has one (a1 is down: its bitmask reads too).
    assert {k for k in changed.gpus[2].values if k.startswith("throttle_")} == {
        s for s, (m, _) in signals.GPU_SERIES.items() if m == signals.CLOCKS_EVENT}


def test_a_live_gpu_without_a_bitmask_keeps_the_per_reason_series_asked_for_it(serve) -> None:
    # An older agent on node-b: its GPU's reasons come from the per-reason series, the others' from the bitmask.
    world = _masked(World(), skip=("b0",))
    world.rows[signals.CLOCKS_EVENT].append(_gpu(B, "b0", "0", 1.0, reason="sw_thermal_slowdown"))
    prom = serve(world.respond)
    per_reason = build_queries(300)[signals.CLOCKS_EVENT]
    src, at = _fetch_at(prom.url, 1000.0, refresh_s=60)
    try:
        at(1000.0)
        _asked(prom)
        # Where a GPU has both and they disagree (they come from one NVML read, so only a server that mixes
        # scrapes), the bitmask is read, between refreshes as in full.
        world.rows[signals.CLOCKS_EVENT][0] = _gpu(A, "a0", "0", 0.0, reason="sw_power_cap")
        _masked(world, skip=("b0",))  # a0's bitmask is 0 now …
        world.rows[signals.CLOCKS_EVENT].append(_gpu(A, "a0", "0", 1.0, reason="hw_slowdown"))  # … this says not
        between = at(1010.0)
        assert f"{per_reason} != 0" in _asked(prom)
    finally:
        src.close()
    assert between.gpus == _full_fetch(prom.url, 1010.0).gpus
    assert between.gpus[0].values["throttle_hw_slowdown"] == 0.0
    assert between.gpus[2].values["throttle_sw_thermal"] == 1.0


def test_a_node_without_a_bitmask_joining_makes_the_next_fetch_ask_the_per_reason_series_again(serve) -> None:
    world = _masked(World())
    prom = serve(world.respond)
    per_reason = build_queries(300)[signals.CLOCKS_EVENT]
    src, at = _fetch_at(prom.url, 1000.0, refresh_s=60)
    try:
        at(1000.0)
        at(1010.0)
        world.rows[IDENTITY].append(_info(B, "b1", "1", "node-b"))
        world.rows[signals.GPU_UP].append(_gpu(B, "b1", "1", 1))
        world.rows["gpumond_gpu_power_limit_watts"].append(_gpu(B, "b1", "1", 500.0))
        world.rows["gpumond_gpu_sm_clock_max_hertz"].append(_gpu(B, "b1", "1", 2e9))
        world.rows[signals.CLOCKS_EVENT].append(_gpu(B, "b1", "1", 1.0, reason="hw_slowdown"))  # no bitmask
        _asked(prom)
        at(1020.0)  # b1 is new: its rarely asked signals and throttle reasons are missing for this fetch …
        assert per_reason not in _asked(prom)
        known = at(1030.0)  # … and the next, a refresh, asks both
        assert per_reason in _asked(prom)
        later = at(1040.0)
        assert f"{per_reason} != 0" in _asked(prom)
    finally:
        src.close()
    b1 = [g for g in known.gpus if g.uuid == "b1"][0]
    assert b1.values["throttle_hw_slowdown"] == 1.0
    assert later.gpus == _full_fetch(prom.url, 1040.0).gpus


def test_a_failed_bitmask_query_is_reported_and_its_signals_are_missing_not_stale(serve) -> None:
    world = _masked(World())
    prom = serve(world.respond)
    mask = build_queries(300)[signals.CLOCKS_EVENT_MASK]
    src, at = _fetch_at(prom.url, 1000.0, refresh_s=60)
    try:
        at(1000.0)
        at(1010.0)
        world.failing.add(f"{mask} != 0")
        failed = at(1020.0)
        world.failing.clear()
        again = at(1030.0)
    finally:
        src.close()
    assert len(failed.errors) == 1 and failed.errors[0].startswith(f"prometheus {mask} != 0: HTTP 503")
    assert not [k for g in failed.gpus for k in g.values if k.startswith("throttle_")]
    assert again.errors == () and again.gpus == _full_fetch(prom.url, 1030.0).gpus


@pytest.mark.parametrize(("value", "active"), [
    (0.0, set()), (float(0x4 | 0x40 | 0x1 | 0x100), {"sw_power_cap", "hw_thermal_slowdown"}),
    (float(0x8 | 0x20 | 0x80), {"hw_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}),
    (-1.0, None), (4.5, None), (2.0**60, None),
])
def test_a_bitmask_decodes_into_the_per_reason_rows(value: float, active: set[str] | None) -> None:
    from gpumond.rules.telemetry.promql_join import mask_rows

    rows = mask_rows([Row({"uuid": "u", "job": "j"}, value), Row({"job": "no uuid"}, 4.0)])
    if active is None:  # not a bitmask: no reading
        assert rows == []
        return
    assert {r.labels["reason"]: r.value for r in rows} == {
        reason: 1.0 if reason in active else 0.0 for reason in signals.REASON_BITS}
    assert {r.labels["uuid"] for r in rows} == {"u"}


def test_the_reason_bits_are_the_agents() -> None:
    from gpumond.nvml.catalogue import CLOCK_EVENT_REASONS

    assert dict(signals.REASON_BITS) == {r: b for b, r in CLOCK_EVENT_REASONS.items() if r in signals.REASON_BITS}
    assert set(signals.REASON_BITS) == {v for m, v in signals.GPU_SERIES.values() if m == signals.CLOCKS_EVENT}
