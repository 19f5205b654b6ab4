"""The agent's power-slack client (gpumond/agent/policy/lease_client.py) against a local HTTP server: offers
renew leases, a withdrawn offer ends its lease, an unreachable or unreadable service renews nothing (one log
line when it starts failing), so leases run out."""

from __future__ import annotations

import json
import socket
import threading
import logging

from gpumond.agent.policy.lease import Guard
from gpumond.agent.policy.lease_client import LeasePuller
from tests.unit.test_read_cli import JSON, serving

A = "GPU-5b0c3b0a-0000-4000-8000-000000000001"


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


def test_offers_renew_leases_and_a_failing_service_lets_them_run_out(caplog) -> None:
    clock = Clock()
    routes = {"/api/v1/power/offers": (200, JSON, json.dumps({"offers": [
        {"gpu_uuid": A, "limit_w": 600, "job": "llama"}]}).encode())}
    with serving(routes) as (url, seen):
        puller = LeasePuller(url, "node-1", lease_s=60, guard=Guard(2, 50), clock=clock,
                             applied=lambda: {A: 700.0})
        puller.poll()
        assert seen == ["/api/v1/power/offers?node=node-1"]
        assert puller.leases().limit(A, clock.t).limit_w == 650  # one guard step down
        routes["/api/v1/power/offers"] = (500, JSON, b'{"error": "evaluation failed"}')
        clock.t += 30
        with caplog.at_level(logging.WARNING, logger="gpumond.policy"):
            puller.poll()
            puller.poll()
        assert [r.getMessage() for r in caplog.records].count(
            "power-slack offers cannot be read: leases run out unless renewed") == 1
        assert puller.leases().limit(A, clock.t) is not None
        clock.t += 30
        assert puller.leases().held == {}  # 60 s after the last good answer
        routes["/api/v1/power/offers"] = (200, JSON, b'{"offers": [{"gpu_uuid": "x", "limit_w": "lots"}]}')
        puller.poll()
        assert puller.failures == 3 and puller.answers == 1
        routes["/api/v1/power/offers"] = (200, JSON, json.dumps({"offers": [
            {"gpu_uuid": A, "limit_w": 600, "job": "llama"}]}).encode())
        puller.poll()
        assert puller.leases().limit(A, clock.t) is not None
        routes["/api/v1/power/offers"] = (200, JSON, b'{"offers": []}')
        puller.poll()
        assert puller.leases().held == {}  # withdrawn: at once
        puller.close()


def test_a_hostile_answer_is_read_bounded_and_renews_nothing() -> None:
    """A broken or hostile rules service cannot make the agent hold a huge body or raise out of poll(): an
    answer over the cap, or nested past what the JSON parser recurses into, is a failure that renews nothing."""
    clock = Clock()
    good = json.dumps({"offers": [{"gpu_uuid": A, "limit_w": 600, "job": "llama"}]}).encode()
    huge = json.dumps({"offers": [{"gpu_uuid": A, "limit_w": 600, "job": "x" * 100}] * 40_000}).encode()
    routes = {"/api/v1/power/offers": (200, JSON, good)}
    with serving(routes) as (url, _):
        puller = LeasePuller(url, "node-1", lease_s=60, guard=Guard(2, 50), clock=clock,
                             applied=lambda: {A: 700.0})
        puller.poll()
        assert puller.answers == 1
        for body in (huge, b"[" * 200_000 + b"]" * 200_000):
            routes["/api/v1/power/offers"] = (200, JSON, body)
            puller.poll()  # never raises
        assert puller.failures == 2 and puller.answers == 1
        clock.t += 60
        assert puller.leases().held == {}  # nothing renewed them
        puller.close()


def test_a_service_that_trickles_its_answer_is_cut_off_at_the_deadline() -> None:
    """httpx's timeout is per read: a server sending a byte at a time would hold the poll (and the agent's
    SIGTERM, which waits for it before restoring limits) for as long as it likes. The whole answer has a deadline."""
    body = json.dumps({"offers": [{"gpu_uuid": A, "limit_w": 600, "job": "llama"}]}).encode()
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body))
            for b in body:  # bounded: the body's length, and stopped when the test ends
                if stop.wait(0.1):
                    return
                try:
                    conn.sendall(bytes([b]))
                except OSError:
                    return

    server = threading.Thread(target=trickle, daemon=True)
    server.start()
    try:
        puller = LeasePuller(f"http://127.0.0.1:{listener.getsockname()[1]}", "node-1", lease_s=60,
                             guard=Guard(2, 50), clock=Clock(), applied=lambda: {A: 700.0}, timeout_s=0.5)
        puller.poll()
        assert puller.failures == 1 and puller.answers == 0
        puller.close()
    finally:
        stop.set()
        server.join(timeout=5)
        listener.close()
