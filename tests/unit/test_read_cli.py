"""`gpumond alerts` and `gpumond findings` against a small stdlib HTTP server on 127.0.0.1: the --url is checked
before anything is fetched; answers become one table or one line."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpumond.cli.alerts import COLUMNS, table
from gpumond.cli import main
from gpumond.cli.findings import measure
from gpumond.cli.read import base_url
from gpumond.cli.findings import table as findings_table
from tests.ports import free_port

JSON = "application/json"
NOW = 1_763_760_000.0  # 2025-11-21T21:20:00Z

ALERTS = [
    {"labels": {"alertname": "GpuThermalSlowdown", "severity": "warning", "node": "gpu-node-01", "gpu": "1",
                "uuid": "GPU-5b0c3b0a-0000-4000-8000-000000000001"},
     "annotations": {"summary": "GPU 1 on gpu-node-01: thermal slowdown"},
     "state": "pending", "startsAt": "2025-11-21T21:19:30.000Z", "endsAt": None,
     "fingerprint": "0123456789abcdef", "generatorURL": "http://gpu-node-01:9480/metrics"},
    {"labels": {"alertname": "StragglerRank", "severity": "warning", "node": "gpu-node-03", "job": "llama-70b-r3",
                "rank": "17", "gpu_uuid": "GPU-aaaabbbb-cccc-dddd-eeee-ffff00001111"},
     "annotations": {"summary": "rank 17 of llama-70b-r3 is a straggler"},
     "state": "resolved", "startsAt": "2025-11-21T20:00:00.000Z", "endsAt": "2025-11-21T21:10:00.000Z",
     "fingerprint": "fedcba9876543210", "generatorURL": "http://rules:9481/api/v1/findings"},
    {"labels": {"alertname": "GpuXidCritical", "severity": "critical", "node": "gpu-node-02", "gpu": "2",
                "uuid": "GPU-5b0c3b0a-0000-4000-8000-000000000002", "xid": "48"},
     "annotations": {"summary": "GPU 2 on gpu-node-02: critical XID (XID 48)"},
     "state": "firing", "startsAt": "2025-11-21T21:15:00.000Z", "endsAt": None,
     "fingerprint": "00112233aabbccdd", "generatorURL": "http://gpu-node-02:9480/metrics"},
]


@contextmanager
def serving(routes: Mapping[str, tuple[int, str, bytes]]) -> Iterator[tuple[str, list[str]]]:
    """A bounded HTTP server on 127.0.0.1 answering GET path -> (status, content type, body); yields (url, paths)."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append(self.path)
            status, ctype, body = routes.get(self.path.split("?")[0], (404, JSON, b'{"error": "no such route"}'))
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.timeout = 5
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def alerts_route(alerts: list[dict]) -> dict[str, tuple[int, str, bytes]]:
    return {"/api/v1/alerts": (200, JSON, json.dumps({"alerts": alerts}).encode())}


closed_port = free_port  # nothing listens there a moment later


def test_the_table_lists_firing_first_with_the_documented_columns(capsys) -> None:
    with serving(alerts_route(ALERTS)) as (url, seen):
        assert main(["alerts", "--url", url]) == 0
    assert seen == ["/api/v1/alerts"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == list(COLUMNS)
    assert [line.split()[0] for line in lines[1:]] == ["GpuXidCritical", "GpuThermalSlowdown", "StragglerRank"]
    firing = lines[1].split()
    assert firing[:5] == ["GpuXidCritical", "critical", "firing", "gpu-node-02", "2"]
    assert "GPU 2 on gpu-node-02: critical XID (XID 48)" in lines[1]
    assert lines[3].split()[2:7] == ["resolved", "gpu-node-03", "GPU-aaaabbbb-cc…", "llama-70b-r3", "17"]


def test_columns_and_since_are_computed_from_the_alert() -> None:
    text = table(ALERTS, now=NOW)
    rows = {line.split()[0]: line for line in text.splitlines()[1:]}
    # SINCE: pending/firing since startsAt, resolved since endsAt.
    assert " 5m00s " in rows["GpuXidCritical"]
    assert " 0m30s " in rows["GpuThermalSlowdown"]
    assert " 10m00s " in rows["StragglerRank"]
    # GPU: the index when there is one, else the UUID shortened; JOB and RANK from the rules service's labels.
    assert rows["StragglerRank"].split()[4] == "GPU-aaaabbbb-cc…"
    assert rows["GpuThermalSlowdown"].split()[5:7] == ["-", "-"]


def test_no_alerts_says_so(capsys) -> None:
    with serving(alerts_route([])) as (url, _):
        assert main(["alerts", "--url", url]) == 0
    assert capsys.readouterr().out == "no alerts\n"


def test_state_filters_the_table_and_the_json(capsys) -> None:
    with serving(alerts_route(ALERTS)) as (url, _):
        assert main(["alerts", "--url", url, "--state", "firing"]) == 0
        table_out = capsys.readouterr().out.splitlines()
        assert main(["alerts", "--url", url, "--state", "resolved", "--json"]) == 0
        body = json.loads(capsys.readouterr().out)
    assert [line.split()[0] for line in table_out[1:]] == ["GpuXidCritical"]
    assert body == {"alerts": [ALERTS[1]]}


@pytest.mark.parametrize("routes, fragment", [
    ({"/api/v1/alerts": (200, "text/html", b"<html>hello</html>")}, "/api/v1/alerts: the answer is not JSON"),
    ({"/api/v1/alerts": (200, JSON, b'{"findings": []}')}, "the answer has no 'alerts' list"),
    ({"/api/v1/alerts": (500, JSON, b'{"error": "evaluation failed"}')}, "HTTP 500 Internal Server Error: "
                                                                         "evaluation failed"),
    ({}, "HTTP 404 Not Found: no such route (is a gpumond agent (:9480) or rules service (:9481) at http://"),
])
def test_a_bad_answer_is_one_line_exit_1(routes, fragment, capsys) -> None:
    with serving(routes) as (url, _):
        assert main(["alerts", "--url", url]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.count("\n") == 1 and out.err.startswith("gpumond alerts: ") and fragment in out.err, out.err


def test_an_unreachable_daemon_is_one_line_that_says_what_to_do(capsys) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    assert main(["alerts", "--url", url]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"gpumond alerts: cannot reach {url}/api/v1/alerts: ")
    assert "set --url" in err


def test_a_url_without_scheme_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["alerts", "--url", "gpu-node-03:9480"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gpu-node-03:9480: missing scheme; use http://gpu-node-03:9480" in err


def test_help_teaches_both_daemons_and_the_default(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["alerts", "--help"])
    out = capsys.readouterr().out
    assert "http://127.0.0.1:9480" in out and "9481" in out and "gpumond alerts --url http://rules:9481" in out


# ----- gpumond findings ------------------------------------------------------------------------------
FINDINGS = [
    {"kind": "io_starved_rank", "job": "llama-70b-r3", "node": "gpu-node-02", "rank": 5, "gpu_uuid": None,
     "score": 4.1, "since": 1_763_759_900.0, "state": "pending", "evidence": {"data_wait_frac": 0.4}},
    {"kind": "straggler", "job": "llama-70b-r3", "node": "gpu-node-01", "rank": 0,
     "gpu_uuid": "GPU-5b0c3b0a-0000-4000-8000-000000000001", "score": 7.5, "since": 1_763_759_700.0,
     "state": "firing", "evidence": {"signals": {"sm_clock": {"value": 1.41e9, "peer_median": 1.98e9}}}},
]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumond.cli", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("url, line", [
    ("not-a-url", "gpumond findings: argument --url: not-a-url: missing scheme; use http://not-a-url:9481"),
    ("127.0.0.1:9481", "gpumond findings: argument --url: 127.0.0.1:9481: missing scheme; use http://127.0.0.1:9481"),
])
def test_a_url_without_scheme_is_one_line_exit_2_that_says_what_to_type(url: str, line: str) -> None:
    p = run("findings", "--url", url)
    assert p.returncode == 2, p.stderr
    assert p.stdout == "" and "Traceback" not in p.stderr
    assert p.stderr.splitlines() == [f"{line} (see: gpumond findings --help)"]


@pytest.mark.parametrize("url, fragment", [
    ("ftp://rules:9481", "scheme 'ftp' is not supported; use http:// or https://"),
    ("http://", "no host; e.g. http://127.0.0.1:9481"),
    ("http://rules:99999", "the port must be a number from 1 to 65535"),
    ("http://rules:9481/?job=x", "give the base URL only, without '?' or '#'"),
    ("http//rules", "is not an http:// or https:// URL; e.g. http://127.0.0.1:9481"),
])
def test_other_bad_urls_are_usage_errors(url: str, fragment: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["findings", "--url", url])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


def test_an_unknown_kind_is_a_usage_error_not_an_empty_fleet(capsys) -> None:
    # The service filters by any string: a typo would print "no findings" and exit 0.
    with pytest.raises(SystemExit) as info:
        main(["findings", "--url", "http://127.0.0.1:9", "--kind", "straggle"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'straggle'" in err and "io_starved_rank" in err, err


@pytest.mark.parametrize("url, expected", [
    ("http://rules:9481", "http://rules:9481"),
    ("https://gateway.example/gpumond/", "https://gateway.example/gpumond"),
    (" http://[::1]:9481/ ", "http://[::1]:9481"),
])
def test_good_base_urls_pass(url: str, expected: str) -> None:
    assert base_url(url, 9481) == expected


def test_findings_are_fetched_with_filters_and_printed_firing_first(capsys) -> None:
    routes = {"/api/v1/findings": (200, JSON, json.dumps({"findings": FINDINGS}).encode())}
    with serving(routes) as (url, seen):
        assert main(["findings", "--url", url + "/", "--job", "llama-70b-r3", "--state", "firing"]) == 0
    assert seen == ["/api/v1/findings?job=llama-70b-r3&state=firing"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["KIND", "STATE", "JOB"]
    assert [line.split()[0] for line in lines[1:]] == ["straggler", "io_starved_rank"]
    assert "GPU-5b0c3b0a-00…" in lines[1] and "sm_clock 1410000000.0 vs 1980000000.0" in lines[1]
    assert findings_table([]) == "no findings"


@pytest.mark.parametrize("body, fragment", [
    (b"[1, 2]", "the answer has no 'findings' list of objects"),
    (b"\xff\xfe not text", "the answer is not JSON"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, "the answer is not JSON", id="nested-past-the-parser"),
])
def test_an_answer_of_the_wrong_shape_is_one_line_exit_1(body: bytes, fragment: str, capsys) -> None:
    with serving({"/api/v1/findings": (200, JSON, body)}) as (url, _):
        assert main(["findings", "--url", url]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpumond findings: ") and fragment in err, err


def test_help_teaches_with_examples() -> None:
    p = run("findings", "--help")
    assert p.returncode == 0 and "gpumond findings --url http://rules:9481" in p.stdout


# ----- units, and what "no findings" means ------------------------------------------------------------------
@pytest.mark.parametrize("finding, expected", [
    ({"kind": "straggler", "score": 7.46, "evidence": {"threshold_z": 3.9}}, "z 7.5 vs peers (flags at 3.9)"),
    ({"kind": "straggler", "score": 4.6, "evidence": {"threshold_z": 5.1, "signals": {"sequential": {
        "value": 1.36, "z": 4.6, "span_s": 10.4}}}}, "compute ×1.36 of peers for 10 s"),
    ({"kind": "straggler_node", "score": 5.0, "evidence": {"threshold_z": 3.5, "gpus_flagged": 3, "gpus_on_node": 8}},
     "z 5.0 vs peers (flags at 3.5), 3/8 GPUs"),
    # The score of an io_starved_rank is a z-score with enough peers and the wait share without: the column
    # shows the share, which means the same either way.
    ({"kind": "io_starved_rank", "score": 0.35,
      "evidence": {"data_wait_frac": 0.3512, "peer_median_data_wait_frac": 0.021}},
     "data wait 35% of step (peers 2%)"),
    ({"kind": "io_starved_job", "score": 0.45, "evidence": {"median_data_wait_frac": 0.4512, "ranks_starved": 12,
                                                             "ranks": 16}},
     "data wait 45% of step (median), 12/16 ranks"),
    ({"kind": "job_slowdown", "score": 1.106, "evidence": {"slowdown": 1.106}}, "step time ×1.11 of baseline"),
    ({"kind": "hung_rank", "score": 2.32, "evidence": {"stalled_for_s": 23.2, "limit_s": 10.0}},
     "no step for 23 s (limit 10 s)"),
    ({"kind": "something_new", "score": 2.0, "evidence": {}}, "score 2.0"),
], ids=lambda v: v["kind"] if isinstance(v, dict) else "")
def test_measure_says_each_kinds_quantity_with_its_unit(finding: dict, expected: str) -> None:
    assert measure(finding) == expected
    header, row = findings_table([{**finding, "state": "firing", "job": "j", "since": 0.0}], now=1.0).splitlines()
    assert "MEASURE" in header and "SCORE" not in header and expected in row


def _rules_metrics(tmp_path, *, pushed: bool, telemetry: bool) -> bytes:
    """A real rules service's /metrics text, with or without a job's push and a telemetry target."""
    import asyncio

    import httpx

    from gpumond.config.rules import RulesConfig
    from gpumond.rules.service import RulesService

    token = "t" * 32
    scrape = {"targets": [f"127.0.0.1:{free_port()}"], "timeout_s": 0.5} if telemetry else {}
    service = RulesService(RulesConfig.model_validate({"tokens": [token], "state_dir": str(tmp_path),
                                                       "telemetry": {"scrape": scrape}}))
    try:
        if pushed:
            body = {"job": "llama", "rank": 0, "world_size": 2, "node": "n0",
                    "gpu_uuid": "GPU-5b0c3b0a-0000-4000-8000-000000000001",
                    "steps": [{"step": 1, "end": time.time(), "duration_s": 0.5, "data_wait_s": 0.0}]}
            async def push() -> httpx.Response:
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=service.app),
                                             base_url="http://rules") as client:
                    return await client.post("/api/v1/push", json=body, headers={"Authorization": f"Bearer {token}"})

            r = asyncio.run(push())
            assert r.status_code < 300, r.text
        if telemetry:
            service.evaluator.poll_telemetry()  # nothing listens there: the fetch fails
        return service.metrics()
    finally:
        service.stop()


@pytest.mark.parametrize("pushed, telemetry, expected", [
    (False, False, "no findings: no job is pushing to it (none has yet, or each one ended or fell silent; check "
                   "GPUMOND_ENDPOINT and GPUMOND_TOKEN in the training job); no GPU telemetry source configured "
                   "(telemetry: in rules.yaml)"),
    (True, True, "no findings: 1 job(s) with 1 rank(s) pushing; GPU telemetry (scrape) configured but its last "
                 "fetch failed"),
], ids=["nothing-known", "a-job-and-a-failing-target"])
def test_no_findings_says_whether_any_job_or_telemetry_is_known(tmp_path, capsys, pushed: bool, telemetry: bool,
                                                                expected: str) -> None:
    routes = {"/api/v1/findings": (200, JSON, b'{"findings": []}'),
              "/metrics": (200, "text/plain", _rules_metrics(tmp_path, pushed=pushed, telemetry=telemetry))}
    with serving(routes) as (url, _):
        assert main(["findings", "--url", url]) == 0
    assert capsys.readouterr().out.strip() == expected
    with serving(routes) as (url, _):
        assert main(["findings", "--url", url, "--job", "llama"]) == 0
    assert capsys.readouterr().out.startswith("no findings for job llama: ")


def test_no_findings_from_a_service_without_metrics_still_answers(capsys) -> None:
    with serving({"/api/v1/findings": (200, JSON, b'{"findings": []}')}) as (url, _):
        assert main(["findings", "--url", url]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("no findings (what the service holds is unknown: ") and "/metrics" in out, out


def test_a_401_asks_for_credentials_or_says_the_ones_given_were_refused(tmp_path, capsys) -> None:
    token = tmp_path / "token"
    token.write_text("a-read-token-of-enough-length\n")
    with serving({"/api/v1/alerts": (401, JSON, b'{"error": "unauthorized"}')}) as (url, _):
        assert main(["alerts", "--url", url]) == 1
        assert "requires read credentials: --username with --password-file, or --token-file" in capsys.readouterr().err
        assert main(["alerts", "--url", url, "--token-file", str(token)]) == 1
    err = capsys.readouterr().err
    assert "refused the credentials given" in err and "requires read credentials" not in err


def test_plain_http_to_a_daemon_that_closes_without_answering_suggests_https(capsys) -> None:
    # A daemon serving TLS closes a plain-HTTP request without an answer; say what to try.
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(5)
    port = listener.getsockname()[1]

    def close_each(n: int = 2) -> None:
        for _ in range(n):  # bounded: one connection per command below
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(4096)
            conn.close()

    thread = threading.Thread(target=close_each, daemon=True)
    thread.start()
    try:
        assert main(["alerts", "--url", f"http://127.0.0.1:{port}"]) == 1
        assert f"(if it serves TLS, use https://127.0.0.1:{port}; else is a gpumond agent" in capsys.readouterr().err
        assert main(["findings", "--url", f"http://127.0.0.1:{port}"]) == 1
        assert f"use https://127.0.0.1:{port}; else is the rules service" in capsys.readouterr().err
    finally:
        listener.close()
        thread.join(5)


def test_jobs_prints_the_services_energy_per_job_running_first(tmp_path, capsys) -> None:
    from gpumond.rules.service import RulesService
    from tests.unit.test_energy_tracker import Batches, board, push
    from gpumond.config.rules import RulesConfig
    from gpumond.rules.types import TelemetryBatch

    uuid = "GPU-5b0c3b0a-0000-4000-8000-000000000001"
    batches = [TelemetryBatch(t, (board(uuid, t, 700.0 * t),)) for t in (0.0, 10.0, 20.0)]
    service = RulesService(RulesConfig.model_validate({"tokens": ["t" * 32], "state_dir": str(tmp_path)}),
                           source=Batches(batches))
    try:
        for step, t in ((10, 0.0), (30, 10.0)):
            push(service.ranks, "llama", 0, uuid, step, t)
            service.evaluator.poll_telemetry()
        push(service.ranks, "llama", 0, uuid, 40, 15.0, final=True)
        push(service.ranks, "bert", 0, "GPU-5b0c3b0a-0000-4000-8000-000000000002", 1, 15.0)
        service.evaluator.poll_telemetry()  # llama ended: its record stays, bert has no GPU reading yet
        body = json.dumps({"jobs": service.energy.view()["jobs"]}).encode()
    finally:
        service.stop()
    with serving({"/api/v1/jobs": (200, JSON, body)}) as (url, _):
        assert main(["jobs", "--url", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["JOB", "STATE", "ENERGY", "MEAN", "POWER", "MEASURED", "STEPS", "PER", "STEP"]
    assert lines[1].split() == ["llama", "ended", "7.0", "kJ", "700", "W", "10", "s", "20", "350", "J"]
    with serving({"/api/v1/jobs": (200, JSON, b'{"jobs": []}')}) as (url, _):
        assert main(["jobs", "--url", url]) == 0
    assert capsys.readouterr().out.startswith("no jobs: the rules service has measured no job's energy yet")


def test_jobs_from_a_service_that_does_not_serve_them_is_one_line_and_exit_1(capsys) -> None:
    with serving({}) as (url, _):
        assert main(["jobs", "--url", url]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HTTP 404" in err and "serves /api/v1/jobs" in err


def test_jobs_shows_energy_per_sample_only_when_some_job_reports_samples() -> None:
    from gpumond.cli.jobs import table

    base = {"state": "running", "energy_joules": 9000.0, "steps": 3, "joules_per_step": 3000.0}
    lines = table([{**base, "job": "llama", "joules_per_sample": 0.0421}, {**base, "job": "bert",
                   "joules_per_sample": None}, {**base, "job": "vit", "joules_per_sample": 12.0}]).splitlines()
    assert lines[0].split()[-2:] == ["PER", "SAMPLE"]
    assert [line.split()[-2:] for line in lines[1:]] == [["42.1", "mJ"], ["kJ", "-"], ["12", "J"]]
    assert "PER SAMPLE" not in table([{**base, "job": "bert", "joules_per_sample": None}])
