"""A real agent against clients that pipeline requests and never read the answers (review 1, items 1 and 2).

Such a client leaves uvicorn waiting, with no timer, for our writes to drain. Before the guard bounded it,
one of them held SIGTERM forever (so the policy never put the power limits back), and a cap's worth of them
made the agent shed every new connection, Prometheus' and the kubelet's probes included. Each test sets
`http.write_timeout_s` far beyond its own length, so what it shows is the shutdown bound and the eviction,
not the write timeout (tests/integration/test_connection_limits.py covers that one on its own).
"""

from __future__ import annotations

import json
import shutil
import socket
import time

import pytest

from tests.integration import helpers
from tests.integration.alert_helpers import RulesDaemon
from tests.integration.helpers import AgentProcess

pytestmark = pytest.mark.integration

NEVER = 600  # s: no test here lasts that long, so no write timeout fires
STOP_S = 20.0  # the agent's 5 s shutdown grace plus its stop, with room for a loaded machine


def _never_reading(port: int, requests: int = 400) -> socket.socket:
    """Pipelined GET /metrics with a 1 KiB receive buffer, none of them read."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    s.settimeout(helpers.HTTP_TIMEOUT_S)
    s.connect((helpers.LOOPBACK, port))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * requests)
    return s


def test_sigterm_with_a_client_that_never_reads_still_restores_the_power_limit(tmp_path) -> None:
    state = tmp_path / "state"
    cfg = helpers.write_yaml(tmp_path / "agent.yaml", {
        "state_dir": str(state), "node_name": "unread-node", "http": {"write_timeout_s": NEVER},
        "policy": {"mode": "enforce"},
        "sampling": {"fast_interval_s": 1, "slow_interval_s": 5}})
    hot = helpers.write_yaml(tmp_path / "hot.yaml", {"faults": [{"gpu": 1, "kind": "cooling", "factor": 1.7,
                                                                 "at_s": 0}]})
    agent = AgentProcess(["--sim", "2", "--sim-speed", "20", "--config", cfg, "--sim-scenario", hot],
                         tmp_path / "agent")
    with agent:
        agent.wait_for_metrics(lambda f: (helpers.value(f, "gpumond_gpu_power_limit_watts", gpu="1") or 700) < 700,
                               timeout=30, what="GPU 1 capped by the thermal policy")
        client = _never_reading(agent.port)
        try:
            time.sleep(1.0)  # the agent is now blocked writing to it
            assert agent.stop(timeout=STOP_S) == 0, agent.describe()  # SIGKILL after STOP_S gives -9
        finally:
            client.close()
    audit = [json.loads(x) for x in (state / "policy-audit.jsonl").read_text().splitlines()]
    assert audit[-1]["action"] == "restore" and audit[-1]["after_w"] == 700, audit[-3:]


def test_clients_that_never_read_cannot_fill_the_connection_cap(tmp_path) -> None:
    prlimit = shutil.which("prlimit")
    if prlimit is None:  # FAIL, never skip: scripts/test.sh installs util-linux
        pytest.fail("'prlimit' is not installed; run `bash scripts/test.sh` or `apt-get install util-linux`",
                    pytrace=False)
    cfg = helpers.write_yaml(tmp_path / "agent.yaml", {
        "state_dir": str(tmp_path / "state"), "node_name": "unread-node", "http": {"write_timeout_s": NEVER},
        "sampling": {"fast_interval_s": 1}})
    agent = AgentProcess(["--sim", "2", "--config", cfg], tmp_path / "agent")
    # 80 descriptors leave room for 16 connections (gpumond/web/connections.py: connection_cap)
    agent.argv = [prlimit, "--nofile=80:80", "--", *agent.argv]
    with agent:
        stuck = [_never_reading(agent.port) for _ in range(20)]
        try:
            time.sleep(2.0)  # every answer is written until the agent's writes to it pause
            for _ in range(3):
                for path in ("/healthz", "/metrics"):
                    status, _, body = agent.get(path)
                    assert status == 200, (path, status, body[:200], agent.describe())
            fams = agent.wait_for_metrics(
                lambda f: (helpers.value(f, "gpumond_http_connections_closed_total", reason="evicted") or 0) > 0,
                timeout=10, what="evictions counted on /metrics")
            assert helpers.value(fams, "gpumond_http_connections_closed_total", reason="write_timeout") == 0
            assert helpers.value(fams, "gpumond_http_connections_limit") == 16
            assert helpers.value(fams, "gpumond_http_connections_peak") >= 16
        finally:
            for s in stuck:
                s.close()
    assert agent.returncode == 0, agent.describe()


def test_the_rules_service_takes_its_http_limits_from_config_and_counts_closures(tmp_path) -> None:
    rules = RulesDaemon(tmp_path, {"tokens": ["unread-token-0123456789"], "state_dir": str(tmp_path / "state"),
                                   "http": {"header_timeout_s": 0.5, "max_connections": 16}}).start()
    try:
        silent = socket.create_connection((helpers.LOOPBACK, rules.port), timeout=helpers.HTTP_TIMEOUT_S)
        try:
            assert silent.recv(1) == b""  # closed by the server after the 0.5 s head timeout, not the default 10 s
        finally:
            silent.close()
        status, _, body = helpers.http_get(f"{rules.url}/metrics")
        assert status == 200
        fams = helpers.parse_metrics(body.decode())
        assert helpers.value(fams, "gpumond_http_connections_closed_total", reason="head_timeout") == 1
        assert helpers.value(fams, "gpumond_http_connections_limit") == 16
        rc, out = helpers.promtool_check_metrics(body)
        assert (rc, out) == (0, ""), out
    finally:
        rules.stop()
