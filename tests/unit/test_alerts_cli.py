"""`gpumond alerts` against a small stdlib HTTP server on 127.0.0.1 that serves GET /api/v1/alerts."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpumond.alerts_cli import COLUMNS, table
from gpumond.cli import main
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
