"""The pusher without its thread: what each reply does to the batch, the counters and the log; backoff."""

from __future__ import annotations

import json
import logging
import time
from collections import deque

import pytest

from gpumond.job import pusher
from gpumond.job.payload import Record
from gpumond.job.pusher import Pusher
from gpumond.job.transport import Reply
from gpumond.wire.retry import Backoff

GPU = "GPU-11111111-1111-1111-1111-111111111111"
HEAD = {"job": "j", "rank": 0, "world_size": 1, "node": "n", "gpu_uuid": GPU, "group": None}


class ScriptedTransport:
    """Answers from a script (a Reply or an exception per request), then 202."""

    def __init__(self, *script: Reply | Exception) -> None:
        self.script = list(script)
        self.batches: list[list[int]] = []
        self.closed = False

    def post(self, body: bytes, timeout_s: float, *, early: bool = False) -> Reply:
        self.batches.append([s["step"] for s in json.loads(body)["steps"]])
        answer = self.script.pop(0) if self.script else Reply(202)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def close(self) -> None:
        self.closed = True


def make(transport: ScriptedTransport, steps: int, max_queue: int = 100, max_steps: int = 10) -> Pusher:
    """A pusher (thread not started) with `steps` records queued."""
    q: deque[Record] = deque(maxlen=max_queue)
    for i in range(steps):
        q.append((i, float(i), 1.0, 0.1, None))
    return Pusher(q, HEAD, transport, interval_s=3600, max_steps=max_steps, timeout_s=1.0,
                  clock=lambda: 1000.0, wall=lambda: 1_700_000_000.0)


def test_success_pushes_everything_in_batches() -> None:
    t = ScriptedTransport()
    p = make(t, 25)
    assert p.drain(1.0) is None
    assert [len(b) for b in t.batches] == [10, 10, 5]
    assert (p.pushed, p.dropped, p.failed, p.pending_len) == (25, 0, 0, 0)


@pytest.mark.parametrize("failure", [Reply(500), Reply(502), Reply(503), Reply(408), Reply(429),
                                     ConnectionRefusedError(111, "Connection refused"), TimeoutError("timed out")])
def test_transient_failures_keep_the_batch_and_ask_to_wait(failure: Reply | Exception,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpumond.job")
    t = ScriptedTransport(failure)
    p = make(t, 5)
    delay = p.drain(1.0)
    assert delay is not None and 0 < delay <= pusher.BACKOFF_BASE_S
    assert (p.pushed, p.dropped, p.failed, p.pending_len) == (0, 0, 1, 5)
    assert p.drain(1.0) is None  # the same batch, sent again
    assert t.batches == [[0, 1, 2, 3, 4]] * 2
    assert (p.pushed, p.dropped, p.failed) == (5, 0, 1)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and "retrying" in messages[0] and "resumed after 1 failed" in messages[1]


def test_retry_after_is_honoured_but_never_shortens_the_backoff() -> None:
    p = make(ScriptedTransport(Reply(429, retry_after_s=7.0), *[Reply(503, retry_after_s=0.0)] * 8), 5)
    p.backoff = Backoff(pusher.BACKOFF_BASE_S, pusher.BACKOFF_CAP_S, rng=lambda: 1.0)
    assert p.drain(1.0) == 7.0
    # "Retry-After: 0" (or a date already past) every time: the doubling schedule, never a busy loop
    assert [p.drain(1.0) for _ in range(8)] == pytest.approx([1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0])


def test_consecutive_failures_back_off_exponentially() -> None:
    p = make(ScriptedTransport(*[Reply(503)] * 12), 5)
    p.backoff = Backoff(pusher.BACKOFF_BASE_S, pusher.BACKOFF_CAP_S, rng=lambda: 1.0)
    delays = [p.drain(1.0) for _ in range(12)]
    assert delays[:5] == pytest.approx([0.5, 1.0, 2.0, 4.0, 8.0], rel=1e-9)
    assert delays[-1] == pytest.approx(pusher.BACKOFF_CAP_S, rel=1e-9)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_rejected_batches_are_dropped_not_retried(status: int) -> None:
    t = ScriptedTransport(Reply(status, detail="steps.0.end: field required"))
    p = make(t, 15)
    assert p.drain(1.0) is None
    assert t.batches == [list(range(10)), list(range(10, 15))]  # the next batch still goes out
    assert (p.pushed, p.dropped, p.failed) == (5, 10, 1)
    assert p.last_error is None  # the next batch was taken
    p = make(ScriptedTransport(Reply(status, detail="steps.0.end: field required")), 5)
    p.drain(1.0)
    assert p.last_error == f"HTTP {status}: steps.0.end: field required"


def test_one_warning_per_distinct_rejection(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gpumond.job")
    t = ScriptedTransport(Reply(401), Reply(401), Reply(401), Reply(400), Reply(401))
    p = make(t, 50, max_steps=10)
    p.drain(1.0)
    assert p.dropped == 50 and p.failed == 5
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert "HTTP 401" in warnings[0] and "HTTP 400" in warnings[1]


def test_413_drops_the_batch_and_halves_later_ones() -> None:
    t = ScriptedTransport(Reply(413), Reply(413))
    p = make(t, 40, max_steps=16)
    p.drain(1.0)
    assert [len(b) for b in t.batches] == [16, 8, 4, 4, 4, 4]
    assert p.limit == 4
    assert (p.pushed, p.dropped) == (16, 24)


def test_a_batch_that_cannot_be_encoded_is_dropped() -> None:
    t = ScriptedTransport()
    q: deque[Record] = deque([(0, 1.0, 1.0, 0.0, None), (1, 2.0, float("nan"), 0.0, None)], maxlen=10)
    p = Pusher(q, HEAD, t, interval_s=3600, max_steps=1, timeout_s=1.0, clock=lambda: 0.0, wall=lambda: 0.0)
    assert p.drain(1.0) is None
    assert (p.pushed, p.dropped, t.batches) == (1, 1, [[0]])
    assert "cannot encode" in (p.last_error or "")


def test_last_error_is_cleared_once_the_service_takes_a_push_again() -> None:
    p = make(ScriptedTransport(Reply(503, detail="overloaded"), Reply(401)), 25)
    p.drain(1.0)
    assert p.last_error == "HTTP 503: overloaded"
    p.drain(1.0)  # the same batch is refused for good, the next ones are taken
    assert p.last_error is None and (p.pushed, p.dropped, p.failed) == (15, 10, 2)


def test_a_heartbeat_taken_clears_the_last_error_too() -> None:
    p = make(ScriptedTransport(ConnectionRefusedError(111, "Connection refused")), 0)
    p._send_marker(1.0, final=False)
    assert p.last_error == "ConnectionRefusedError: [Errno 111] Connection refused"
    p._send_marker(1.0, final=False)
    assert p.last_error is None and p.beats == 1


def test_the_thread_flushes_on_close_and_releases_the_connection() -> None:
    t = ScriptedTransport()
    p = make(t, 25)
    p.start()
    p.close(timeout_s=5)
    assert p.pushed == 25 and t.closed


def test_close_with_the_service_down_returns_in_time_and_counts_the_rest() -> None:
    t = ScriptedTransport(*[ConnectionRefusedError(111, "refused")] * 1000)
    p = make(t, 25)
    p.start()
    started = time.monotonic()
    p.close(timeout_s=0.3)
    assert time.monotonic() - started < 1.0
    assert (p.pushed, p.dropped, p.pending_len, len(p._q)) == (0, 25, 0, 0)


def test_steps_the_service_did_not_store_are_counted_dropped_by_reason_with_one_warning(caplog) -> None:
    # A rank whose clock is behind the service's window: 202, nothing stored, and the body says why.
    t = ScriptedTransport(Reply(202, dropped=(("stale", 10),)), Reply(202, dropped=(("stale", 10),)),
                          Reply(202, dropped=(("stale", 3), ("duplicate", 2))))
    p = make(t, 30)
    assert p.drain(1.0) is None
    assert (p.pushed, p.dropped) == (5, 25)
    assert dict(p.service_dropped) == {"stale": 23, "duplicate": 2}
    warnings = [r.getMessage() for r in caplog.records if "did not store" in r.getMessage()]
    assert len(warnings) == 2 and "clock" in warnings[0] and "(stale)" in warnings[0]  # one per reason


def test_duplicates_after_a_retry_are_steps_the_earlier_attempt_stored() -> None:
    # The first attempt reached the service but its answer was lost: the retry finds the steps held.
    t = ScriptedTransport(TimeoutError("timed out"), Reply(202, dropped=(("duplicate", 10),)))
    p = make(t, 10)
    assert p.drain(1.0) is not None  # wait, then retry
    assert p.drain(1.0) is None
    assert (p.pushed, p.dropped, dict(p.service_dropped)) == (10, 0, {})


def test_a_malformed_dropped_field_counts_as_nothing_said() -> None:
    from gpumond.job.transport import _dropped
    assert _dropped(b'{"accepted":0,"dropped":{"stale":5,"x":"y","z":-1,"b":true}}') == (("stale", 5),)
    assert _dropped(b'{"accepted":1,"dropped":[1]}') == ()
    assert _dropped(b"not json") == ()
