import asyncio
import gzip

from gpumond.agent.exposition import Rendered
from gpumond.agent.server import AgentApp

RENDERED = Rendered(b"gpumond_gpu_up 1\n", gzip.compress(b"gpumond_gpu_up 1\n"), 1.0)


def call(app, path, method="GET", headers=()):
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg):
        sent.append(msg)

    scope = {"type": "http", "path": path, "method": method, "headers": list(headers)}
    asyncio.run(app(scope, receive, send))
    start, body = sent
    return start["status"], dict(start["headers"]), body["body"]


def test_metrics_served_from_cache_plain_and_gzip():
    app = AgentApp(lambda: RENDERED, lambda: (True, "ok"))
    status, headers, body = call(app, "/metrics")
    assert status == 200 and body == RENDERED.plain
    assert headers[b"content-type"].startswith(b"text/plain; version=0.0.4")
    status, headers, body = call(app, "/metrics", headers=[(b"accept-encoding", b"gzip, deflate")])
    assert headers[b"content-encoding"] == b"gzip" and gzip.decompress(body) == RENDERED.plain
    assert int(headers[b"content-length"]) == len(body)


def test_no_sample_yet_is_503_and_health_reflects_the_agent():
    app = AgentApp(lambda: None, lambda: (False, "stale: last sample 40.0s ago"))
    assert call(app, "/metrics")[0] == 503
    status, _, body = call(app, "/healthz")
    assert status == 503 and b"stale" in body


def test_other_paths_and_methods():
    app = AgentApp(lambda: RENDERED, lambda: (True, "ok"))
    assert call(app, "/nope")[0] == 404
    status, headers, _ = call(app, "/metrics", method="POST")
    assert status == 405 and headers[b"allow"] == b"GET, HEAD"
    status, _, body = call(app, "/metrics", method="HEAD")
    assert status == 200 and body == b""


import pytest

from gpumond.agent.server import accepts_gzip


@pytest.mark.parametrize("header, ok", [
    (b"gzip", True), (b"gzip, deflate", True), (b"identity, gzip;q=0", False), (b"gzip;q=0.5", True),
    (b"*", True), (b"*;q=0", False), (b"deflate", False), (b"", False), (b"*, gzip;q=0", False),
    (b"GZIP", True), (b"gzip;q=bogus", False),
])
def test_gzip_negotiation(header, ok):
    assert accepts_gzip(header) is ok
