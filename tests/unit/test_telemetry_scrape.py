"""ScrapeSource against fake agents on a local stdlib HTTP server: timeouts, 500s, garbage, file_sd, gzip."""

from __future__ import annotations

import contextlib
import gzip
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpumond.rules.telemetry import ScrapeSource, read_agent
from gpumond.rules.telemetry.scrape import wanted_lines
from tests.ports import free_port
from tests.unit.agent_exposition import GOLDEN, U0, U1, U2

TIMEOUT_S = 0.5
# Anything a fake agent does slowly ends when the test ends, so teardown is bounded too.
SLOW_S = 5.0


class FakeAgent:
    """A /metrics endpoint on 127.0.0.1 whose behaviour a test sets: ok, 500, garbage, slow, trickle, …"""

    def __init__(self, mode: str = "ok", text: str = GOLDEN) -> None:
        self.mode, self.text = mode, text
        self.requests: list[dict[str, str]] = []
        self.release = threading.Event()
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                agent.requests.append({k.lower(): v for k, v in self.headers.items()})
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the scraper gave up on us
                    agent.respond(self)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)
        self.thread.start()

    def respond(self, h: BaseHTTPRequestHandler) -> None:
        if self.mode == "slow":
            self.release.wait(SLOW_S)
        if self.mode == "trickle":
            h.send_response(200)
            h.send_header("Content-Length", "1000000")
            h.end_headers()
            for _ in range(int(SLOW_S / 0.1)):
                if self.release.wait(0.1):
                    return
                h.wfile.write(b"#")
                h.wfile.flush()
            return
        status, body = {
            "500": (500, b"internal error\n"),
            "html": (200, b"<html><body>login required</body></html>\n"),
            "garbage": (200, b'gpumond_gpu_up{gpu="0",uuid="GPU-1" 1\n'),
            "not_agent": (200, b'node_cpu_seconds_total{cpu="0",mode="idle"} 5\n'),
        }.get(self.mode, (200, self.text.encode()))
        gz = self.mode == "ok" and "gzip" in h.headers.get("Accept-Encoding", "")
        if gz:
            body = gzip.compress(body)
        h.send_response(status)
        h.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        if gz:
            h.send_header("Content-Encoding", "gzip")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake() -> Iterator[type[FakeAgent]]:
    started: list[FakeAgent] = []

    class Tracked(FakeAgent):
        def __init__(self, *a: object, **kw: object) -> None:
            super().__init__(*a, **kw)  # type: ignore[arg-type]
            started.append(self)

    yield Tracked
    for agent in started:
        agent.close()


@pytest.fixture
def sources() -> Iterator[list[ScrapeSource]]:
    made: list[ScrapeSource] = []
    yield made
    for s in made:
        s.close()


def _source(sources: list[ScrapeSource], *args: object, **kw: object) -> ScrapeSource:
    kw.setdefault("timeout_s", TIMEOUT_S)
    s = ScrapeSource(*args, **kw)  # type: ignore[arg-type]
    sources.append(s)
    return s


def _refused_address() -> str:
    return f"127.0.0.1:{free_port()}"  # nothing listens there a moment later


def _file_sd(path: Path, groups: list[dict[str, object]]) -> Path:
    path.write_text(json.dumps(groups), encoding="utf-8")
    return path


def test_failing_targets_are_absent_and_never_fail_the_good_one(fake, sources, tmp_path: Path) -> None:
    good = fake("ok")
    bad = {name: fake(name).address for name in ("500", "garbage", "html", "slow", "not_agent")}
    bad["refused"] = _refused_address()
    sd = _file_sd(tmp_path / "sd.json", [{"targets": [addr], "labels": {"node": f"bad-{name}"}}
                                         for name, addr in bad.items()])
    src = _source(sources, [good.address], file_sd=sd, clock=lambda: 1234.5)

    started = time.monotonic()
    batch = src.fetch()
    elapsed = time.monotonic() - started

    assert [(g.uuid, g.node, g.up) for g in batch.gpus] == [(U0, "gpu-node-07", True), (U1, "gpu-node-07", True),
                                                           (U2, "gpu-node-07", False)]
    assert [h.node for h in batch.hosts] == ["gpu-node-07"]
    assert batch.t == 1234.5 and {g.t for g in batch.gpus} == {1234.5}
    assert batch.absent_nodes == {f"bad-{name}" for name in bad}
    assert len(batch.errors) == len(bad), batch.errors
    by_target = {addr: next(e for e in batch.errors if e.startswith(f"scrape {addr}: ")) for addr in bad.values()}
    assert "HTTP 500" in by_target[bad["500"]]
    assert "unparsable exposition" in by_target[bad["garbage"]]
    assert f"timed out after {TIMEOUT_S:g}s" in by_target[bad["slow"]]
    assert "no gpumond metrics" in by_target[bad["not_agent"]]
    assert "no gpumond metrics" in by_target[bad["html"]]
    assert "ConnectError" in by_target[bad["refused"]]
    assert elapsed < TIMEOUT_S + 1.5, f"targets were not scraped concurrently within their timeout ({elapsed:.2f}s)"


def test_only_mapped_families_are_parsed_and_they_map_the_same() -> None:
    kept = wanted_lines(GOLDEN)
    assert "# HELP" not in kept and "build_info" not in kept and "energy_joules_total" in kept
    assert 'reason="gpu_idle"' in kept  # whole families are kept; the mapping picks reasons
    full = read_agent(text_string_to_metric_families(GOLDEN), t=1.0, fallback_node="x")
    assert read_agent(text_string_to_metric_families(kept), t=1.0, fallback_node="x") == full
    label_with_line_separator = 'gpumond_gpu_job_info{gpu="0",job="a\u2028b",uuid="U"} 1'
    assert wanted_lines(label_with_line_separator) == label_with_line_separator + "\n"


def test_gzip_is_requested_and_decoded(fake, sources) -> None:
    agent = fake("ok")
    batch = _source(sources, [agent.address]).fetch()
    assert len(batch.gpus) == 3 and batch.errors == ()
    assert "gzip" in agent.requests[0]["accept-encoding"]
    assert agent.requests[0]["accept"].startswith("text/plain")


def test_a_trickling_target_is_cut_at_its_deadline(fake, sources) -> None:
    agent = fake("trickle")
    started = time.monotonic()
    batch = _source(sources, [agent.address]).fetch()
    assert time.monotonic() - started < TIMEOUT_S + 1.0
    assert batch.absent_nodes == {"127.0.0.1"} and "timed out" in batch.errors[0]


def test_an_oversize_body_is_refused(fake, sources) -> None:
    agent = fake("ok")
    batch = _source(sources, [agent.address], max_body_bytes=100).fetch()
    assert batch.gpus == () and "larger than 100 bytes" in batch.errors[0]


def test_a_failed_target_is_absent_under_the_node_name_it_last_had(fake, sources) -> None:
    agent = fake("ok")
    src = _source(sources, [agent.address])
    assert {g.node for g in src.fetch().gpus} == {"gpu-node-07"}
    agent.mode = "500"
    batch = src.fetch()
    assert (batch.gpus, batch.absent_nodes) == ((), {"gpu-node-07"})
    agent.mode = "ok"
    assert len(src.fetch().gpus) == 3


def test_file_sd_changes_are_picked_up_and_a_broken_file_keeps_the_last_list(fake, sources,
                                                                             tmp_path: Path) -> None:
    a, b = fake("ok"), fake("ok", text=GOLDEN.replace("gpu-node-07", "gpu-node-08").replace("GPU-", "GPU-b"))
    path = _file_sd(tmp_path / "sd.json", [{"targets": [a.address]}])
    src = _source(sources, file_sd=path)
    assert {g.node for g in src.fetch().gpus} == {"gpu-node-07"}

    _file_sd(path, [{"targets": [a.address]}, {"targets": [b.address], "labels": {"node": "rack2-n8"}}])
    batch = src.fetch()
    assert {g.node for g in batch.gpus} == {"gpu-node-07", "rack2-n8"} and batch.errors == ()

    path.write_text('[{"targets": [', encoding="utf-8")
    batch = src.fetch()
    assert {g.node for g in batch.gpus} == {"gpu-node-07", "rack2-n8"}
    assert len(batch.errors) == 1 and "not valid JSON" in batch.errors[0] and str(path) in batch.errors[0]


def test_the_same_agent_under_two_addresses_is_reported_once(fake, sources) -> None:
    agent = fake("ok")
    port = agent.address.rsplit(":", 1)[1]
    batch = _source(sources, [agent.address, f"localhost:{port}"]).fetch()
    assert len(batch.gpus) == 3
    assert len(batch.hosts) == 2  # host evidence is per target; harmless duplicates under one node name
    assert len(batch.errors) == 3 and all("already reported by node gpu-node-07" in e for e in batch.errors)


def test_many_slow_targets_take_one_timeout_not_many(fake, sources) -> None:
    agents = [fake("slow") for _ in range(8)]
    started = time.monotonic()
    batch = _source(sources, [a.address for a in agents], max_workers=8).fetch()
    assert time.monotonic() - started < TIMEOUT_S + 1.5
    assert len(batch.errors) == 8 and batch.absent_nodes == {"127.0.0.1"}


def test_no_targets_is_an_empty_batch_and_bad_static_targets_fail_at_construction(sources) -> None:
    batch = _source(sources, []).fetch()
    assert (batch.gpus, batch.hosts, batch.absent_nodes, batch.errors) == ((), (), frozenset(), ())
    with pytest.raises(ValueError, match="not host:port"):
        ScrapeSource(["gpu-node-01"])
