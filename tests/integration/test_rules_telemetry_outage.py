"""A telemetry outage (the Prometheus source answering 500) must not take the push API out of service.

/readyz means "can accept pushes": it stays 200 through the outage and says the source is failing; /healthz
and /metrics report the source's health; the log says it once when it starts failing (then at most every
TELEMETRY_LOG_EVERY_S) and once when it recovers. A real PrometheusSource against a local HTTP server.
"""

from __future__ import annotations

import contextlib
import json
import socket
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import httpx
import uvicorn

from gpumond.config.rules import RulesConfig
from gpumond.rules.service import RulesService

TOKEN = "outage-test-token-0123456789"


class FakePrometheus:
    """Answers /api/v1/query with `status` (500 while `down`, else an empty success)."""

    def __init__(self) -> None:
        self.down = True
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                if outer.down:
                    body, code = b'{"status":"error","errorType":"internal","error":"storage down"}', 500
                else:
                    body, code = b'{"status":"success","data":{"resultType":"vector","result":[]}}', 200
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET  # noqa: N815

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@contextlib.contextmanager
def serving(app) -> Iterator[httpx.Client]:
    """The app under uvicorn on 127.0.0.1 (a thread), and a client for it."""
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, access_log=False, lifespan="off", log_config=None))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}", timeout=5) as c:
            yield c
    finally:
        server.should_exit = True
        thread.join(5)
        sock.close()


@pytest.fixture
def prometheus() -> Iterator[FakePrometheus]:
    p = FakePrometheus()
    yield p
    p.server.shutdown()
    p.server.server_close()


def test_a_telemetry_outage_keeps_pushes_ready_and_is_reported(prometheus, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="gpumond.rules")
    config = RulesConfig.model_validate({"tokens": [TOKEN], "state_dir": str(tmp_path),
                                         "telemetry": {"prometheus": {"url": prometheus.url, "interval_s": 1,
                                                                      "timeout_s": 1}}})
    service = RulesService(config)
    try:
        for _ in range(5):
            service.evaluator.poll_telemetry()
        service.evaluator.evaluate()
        with serving(service.app) as c:
            r = c.get("/readyz")
            assert r.status_code == 200, r.text
            assert r.text.startswith("ready: accepting pushes\nevaluations: 1\ntelemetry prometheus: failing"), r.text
            now = time.time()
            step = {"step": 1, "end": now, "duration_s": 0.5, "data_wait_s": 0.01, "samples": 8}
            pushed = c.post("/api/v1/push", content=json.dumps({
                "job": "llama", "rank": 0, "world_size": 1, "node": "n", "gpu_uuid": "GPU-5b0c3a3e-1c2d-4e5f-8a9b-0c1d2e3f4a5b", "steps": [step]}),
                headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
            assert pushed.status_code == 202 and pushed.json()["accepted"] == 1, pushed.text
            health = c.get("/healthz")
            assert health.status_code == 200 and "telemetry prometheus: failing" in health.text
            metrics = c.get("/metrics").text
            assert 'gpumond_rules_telemetry_up{source="prometheus"} 0' in metrics
            assert 'gpumond_rules_telemetry_errors_total{source="prometheus"} 5' in metrics
        failing = [x for x in caplog.records if x.getMessage().startswith("telemetry source")]
        assert [x.getMessage() for x in failing] == ["telemetry source failing"]  # once, not per fetch
        assert "500" in failing[0].error or "storage down" in failing[0].error
        prometheus.down = False
        service.evaluator.poll_telemetry()
        assert [x.getMessage() for x in caplog.records if x.getMessage().startswith("telemetry source")][-1] == \
            "telemetry source recovered"
        assert service.evaluator.telemetry_status() == "telemetry prometheus: ok"
    finally:
        service.stop()


def test_sighup_stops_the_rules_service_cleanly_with_one_line(tmp_path) -> None:
    import signal

    from tests.integration.alert_helpers import RulesDaemon

    daemon = RulesDaemon(tmp_path, {"tokens": [TOKEN], "state_dir": str(tmp_path / "state")})
    with daemon:  # entering starts it and waits until it serves
        assert daemon.stop(sig=signal.SIGHUP) == 0
    out = daemon.stderr() + daemon.stdout()
    assert "signal=SIGHUP" in out and "rules service stopped" in out, out[-2000:]
