"""Hostile input to the relay's listener of a real agent: malformed, oversize, lying and flooding pushes get one of
the push API's documented answers (never a 5xx), and a slow loris on the relay is held off by the shared connection
guard while ranks still push and /metrics still answers."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from tests.integration.helpers import LOOPBACK, AgentProcess, free_port, http_get, value
from tests.integration.hostile import SlowLoris, hostile_requests, post, raw_request, rss_bytes, valid_push

pytestmark = pytest.mark.integration

TOKEN = "relay-hostile-token-0123456789"
# What the rules service may answer a push (docs/rules-api.md) that the relay answers by itself; 401 and 429 come
# only from upstream, which is down here.
DOCUMENTED = {202, 400, 404, 405, 413, 415, 422}


@pytest.fixture(scope="module")
def relayed(tmp_path_factory: pytest.TempPathFactory) -> tuple[AgentProcess, int]:
    work = tmp_path_factory.mktemp("relay-hostile")
    relay_port = free_port()
    config = work / "agent.json"
    # The upstream is a closed port: the relay holds what it takes (bounded) and counts the failures.
    config.write_text(json.dumps({"policy": {"mode": "off"}, "state_dir": str(work / "state"),
                                  "http": {"header_timeout_s": 1.0, "body_timeout_s": 1.0},
                                  "relay": {"upstream": f"http://{LOOPBACK}:{free_port()}",
                                            "buffer_max_bytes": 262_144}}))
    agent = AgentProcess(["--sim", "1", "--config", config, "--relay-listen", f"{LOOPBACK}:{relay_port}"], work)
    with agent:
        yield agent, relay_port


@pytest.mark.parametrize("encoding", ["json", "columns"])
def test_hostile_pushes_get_documented_answers_and_the_buffer_stays_bounded(relayed, encoding: str) -> None:
    agent, port = relayed
    by_kind: dict[str, Counter] = {}
    floods = {"jobs": 300, "steps": 20_000}  # past the relay's 256 KiB buffer
    for kind, request, half_close in hostile_requests(TOKEN, floods=floods, encoding=encoding, held_jobs=5):
        by_kind.setdefault(kind, Counter())[raw_request(port, request, half_close=half_close)] += 1
    every = sum(by_kind.values(), Counter())
    assert sum(every.values()) > 400
    assert {k: c for k, c in by_kind.items() if set(c) - DOCUMENTED - {None}} == {}, by_kind
    assert {k for k, c in by_kind.items() if None in c} <= {"lying_length", "headers"}, by_kind
    assert all(by_kind[k][422] for k in ("control_chars", "numbers")) and by_kind["flood_jobs"][202] > 0
    # /metrics is rendered each fast cycle (1 s): wait for the one after the flood
    metrics = agent.wait_for_metrics(lambda m: value(m, "gpumond_relay_steps_dropped_total", reason="buffer_full"),
                                     timeout=10, what="the flood's oldest pushes dropped for room")
    assert value(metrics, "gpumond_relay_buffer_bytes") <= 262_144
    assert rss_bytes(agent.proc.pid) < 400 * 2**20  # type: ignore[union-attr]


def test_a_slow_loris_on_the_relay_is_cut_by_the_guard_while_ranks_push(relayed) -> None:
    agent, port = relayed
    loris = SlowLoris(port, connections=200, drip_s=0.3,
                      head=b"POST /api/v1/push HTTP/1.1\r\nContent-Type: application/json\r\nX-a: ").start()
    try:
        deadline = time.monotonic() + 3.0
        answered = Counter()
        while time.monotonic() < deadline:  # bounded: 3 s of pushes on fresh connections
            body = json.dumps(valid_push(job="loris-time", steps=1, first=int(time.monotonic() * 1000))).encode()
            answered[raw_request(port, post("/api/v1/push", body, TOKEN))] += 1
            time.sleep(0.1)
        assert answered[202] >= 0.9 * sum(answered.values()), answered
        assert http_get(f"{agent.base_url}/metrics")[0] == 200
    finally:
        loris.stop()
    agent.wait_for_metrics(lambda m: value(m, "gpumond_http_connections_closed_total", reason="head_timeout"),
                           timeout=10, what="the guard closing the loris' connections")
