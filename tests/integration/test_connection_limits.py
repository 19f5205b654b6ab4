"""The shared server's connection bounds on a real uvicorn, in-process, with short limits (gpumond/web/connections.py).

Each test opens raw sockets to 127.0.0.1 and waits, bounded, for the server to act; no timing is asserted.
"""

from __future__ import annotations

import logging
import time

import pytest

from gpumond.web.connections import ConnectionLimits, connection_cap
from gpumond.web.protocols import guarded_protocol
from tests.integration.guarded_server import (
    WAIT_S,
    closed_by_server,
    connect,
    get,
    never_reading,
    response,
    serving,
)
from tests.integration.helpers import wait_until

pytestmark = pytest.mark.integration


def test_a_connection_that_sends_nothing_or_half_a_head_is_closed_after_the_head_timeout(http_parser: str) -> None:
    with serving(parser=http_parser) as (port, stats):
        silent, half = connect(port), connect(port, b"GET /metr")
        assert closed_by_server(silent) and closed_by_server(half)
        assert stats.head_timeouts == 2


def test_a_head_dripped_a_byte_at_a_time_does_not_reset_the_deadline(http_parser: str) -> None:
    with serving(parser=http_parser) as (port, stats):
        # A valid head whose header value grows by one byte every 0.1 s: data arrives, the head never completes
        # (a byte-dripped request *line* is refused outright as an invalid method by llhttp, so not used here).
        s = connect(port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Drip: ")
        deadline = time.monotonic() + WAIT_S
        try:
            while time.monotonic() < deadline:
                s.sendall(b"a")
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert closed_by_server(s)
        assert stats.head_timeouts == 1


def test_a_body_that_never_completes_is_closed_after_the_body_timeout(http_parser: str) -> None:
    with serving(parser=http_parser) as (port, stats):
        s = connect(port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly part")
        assert closed_by_server(s)
        assert stats.body_timeouts == 1 and stats.head_timeouts == 0


def test_part_of_a_next_head_sent_behind_a_request_is_held_to_the_head_timeout(http_parser: str) -> None:
    # keep-alive far longer than the head timeout: only the head deadline, started when the answer is complete, can
    # close it (h11 finds the part in its buffer; llhttp has already begun parsing the second request)
    with serving(ConnectionLimits(header_timeout_s=0.5, body_timeout_s=30, keepalive_timeout_s=30, max_connections=4),
                 parser=http_parser) as (port, stats):
        s = connect(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHo")
        assert response(s).startswith(b"HTTP/1.1 200")
        assert closed_by_server(s)
        assert stats.head_timeouts == 1
        s.close()


def test_past_the_cap_the_longest_waiting_idle_connection_makes_room(http_parser: str) -> None:
    with serving(ConnectionLimits(header_timeout_s=30, body_timeout_s=30, keepalive_timeout_s=30, max_connections=4,
                                  evict_after_s=0.1), parser=http_parser) as (port, stats):
        idle = [connect(port) for _ in range(4)]
        time.sleep(0.2)  # the server has accepted them all, and they have waited past evict_after_s
        assert get(port).startswith(b"HTTP/1.1 200")  # a fifth client is served…
        assert closed_by_server(idle[0], timeout=WAIT_S)  # …by closing the connection idle the longest
        assert stats.evicted >= 1 and stats.shed == 0
        for s in idle:
            s.close()


def test_past_the_cap_a_just_opened_connection_is_spared_and_a_kept_alive_idle_one_makes_room(
        http_parser: str) -> None:
    # A connection opened less than evict_after_s ago has most likely sent its head and is not read yet (a burst
    # of clients accepted together): closing it for the next one would close every one of the burst but the last.
    with serving(ConnectionLimits(header_timeout_s=30, body_timeout_s=30, keepalive_timeout_s=30, max_connections=2,
                                  evict_after_s=30), parser=http_parser) as (port, stats):
        kept = connect(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert response(kept).startswith(b"HTTP/1.1 200")  # now kept alive, idle
        fresh = connect(port)
        time.sleep(0.2)  # the server has accepted it
        assert get(port).startswith(b"HTTP/1.1 200")  # a third client is served…
        assert closed_by_server(kept)  # …by closing the kept-alive idle one…
        assert not closed_by_server(fresh, timeout=0.3)  # …not the one just opened
        assert stats.evicted == 1 and stats.shed == 0
        kept.close()
        fresh.close()


def test_past_the_cap_with_only_just_opened_connections_the_newest_is_shed(http_parser: str) -> None:
    with serving(ConnectionLimits(header_timeout_s=30, body_timeout_s=30, keepalive_timeout_s=30, max_connections=2,
                                  evict_after_s=30), parser=http_parser) as (port, stats):
        first = [connect(port) for _ in range(2)]
        time.sleep(0.2)
        newest = connect(port)
        assert closed_by_server(newest)  # the connections come in order: the newest waits for a later try
        assert stats.shed == 1 and stats.evicted == 0
        assert not any(closed_by_server(s, timeout=0.3) for s in first)
        for s in first:
            s.close()


def test_past_the_cap_with_every_connection_busy_the_newest_is_shed(http_parser: str) -> None:
    with serving(ConnectionLimits(header_timeout_s=30, body_timeout_s=30, keepalive_timeout_s=30, max_connections=2),
                 parser=http_parser) as (port, stats):
        # two requests whose bodies are still arriving: busy, not idle
        busy = [connect(port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab") for _ in range(2)]
        time.sleep(0.2)
        newest = connect(port)
        assert closed_by_server(newest)
        assert stats.shed == 1
        for s in busy:
            s.sendall(b"cdefghij")
            assert response(s).startswith(b"HTTP/1.1 200")  # the busy ones finish normally
            s.close()


def test_a_client_that_pipelines_and_never_reads_is_closed_after_the_write_timeout(http_parser: str) -> None:
    with serving(ConnectionLimits(header_timeout_s=30, body_timeout_s=30, keepalive_timeout_s=30, write_timeout_s=0.5,
                                  max_connections=4), parser=http_parser) as (port, stats):
        s = never_reading(port)
        # the request is complete and its answer is being written: only the write timeout can end it
        wait_until(lambda: stats.write_timeouts == 1, timeout=WAIT_S, what="the write timeout")
        assert closed_by_server(s)
        assert (stats.head_timeouts, stats.body_timeouts, stats.evicted, stats.shed) == (0, 0, 0, 0)
        assert get(port).startswith(b"HTTP/1.1 200")
        s.close()


def test_past_the_cap_a_connection_whose_client_does_not_read_makes_room(http_parser: str) -> None:
    with serving(ConnectionLimits(header_timeout_s=30, body_timeout_s=30, keepalive_timeout_s=30, write_timeout_s=30,
                                  max_connections=2), parser=http_parser) as (port, stats):
        stuck = [never_reading(port) for _ in range(2)]
        time.sleep(0.5)  # both answers are written until the transport pauses
        for _ in range(3):  # fresh clients are served, each by closing a connection that reads nothing
            assert get(port).startswith(b"HTTP/1.1 200")
        assert stats.evicted >= 1 and stats.shed == 0 and stats.write_timeouts == 0
        assert closed_by_server(stuck[0])
        for s in stuck:
            s.close()


def test_the_counters_are_series_for_metrics(http_parser: str) -> None:
    with serving(parser=http_parser) as (port, stats):
        assert get(port).startswith(b"HTTP/1.1 200")
        s = connect(port)
        assert closed_by_server(s)
        series = {(x.name, x.labels): x.value for x in stats.series()}
        assert series[("gpumond_http_connections_closed_total", (("reason", "head_timeout"),))] == 1
        assert series[("gpumond_http_connections_closed_total", (("reason", "shed"),))] == 0
        assert series[("gpumond_http_connections_limit", ())] == 4
        assert series[("gpumond_http_connections_peak", ())] >= 1


def test_a_flood_of_one_kind_of_closing_does_not_hide_another_kinds_warning(http_parser: str) -> None:
    from gpumond.logs import RateLimit

    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    handler.addFilter(RateLimit(burst=3))  # the daemons' per-call-site limit, with a small burst
    logger = logging.getLogger("gpumond.serving")
    logger.addHandler(handler)
    try:
        with serving(ConnectionLimits(header_timeout_s=0.2, body_timeout_s=30, keepalive_timeout_s=30,
                                      max_connections=2), parser=http_parser) as (port, stats):
            for _ in range(6):  # more head timeouts than the burst lets through
                with connect(port) as s:
                    assert closed_by_server(s)
            busy = [connect(port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab") for _ in range(2)]
            time.sleep(0.2)
            with connect(port) as s:
                assert closed_by_server(s)  # shed: both held connections are busy
            assert stats.head_timeouts == 6 and stats.shed == 1
            for s in busy:
                s.close()
    finally:
        logger.removeHandler(handler)
    assert seen.count("connection closed: request head not complete in time") == 3
    assert "connection shed: every held connection is busy or just opened" in seen


def test_a_kept_alive_connection_is_served_again_then_closed_when_idle(http_parser: str) -> None:
    with serving(parser=http_parser) as (port, stats):
        s = connect(port)
        for _ in range(3):
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert response(s).startswith(b"HTTP/1.1 200")
        assert closed_by_server(s)  # the keep-alive idle timeout
        assert stats.head_timeouts == 0


def test_the_cap_is_the_configured_one_lowered_to_fit_the_descriptor_limit() -> None:
    assert connection_cap(ConnectionLimits(), nofile=1024) == 896
    # a container's 1,048,576 descriptors must not let a flood hold ~900 k connections (~4.7 KB each)
    assert connection_cap(ConnectionLimits(), nofile=1_048_576) == 4096
    assert connection_cap(ConnectionLimits(), nofile=65_536) == 4096
    assert connection_cap(ConnectionLimits(max_connections=60_000), nofile=65_536) == 57_344
    assert connection_cap(ConnectionLimits(max_connections=10), nofile=1024) == 10


def test_an_unknown_parser_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown HTTP parser 'picohttp': one of httptools, h11"):
        guarded_protocol(ConnectionLimits(), parser="picohttp")
