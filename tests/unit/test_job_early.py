"""Early pushes (gpumond/job/early.py): the rule, and the reporter and push thread acting on it."""

from __future__ import annotations

import math
import time
from collections import deque

from gpumond.job import Reporter
from gpumond.job.early import EarlyPush, StepHistory, push_early, regular_after_early, stand_out_above
from gpumond.job.payload import Record
from gpumond.job.pusher import Pusher
from gpumond.job.transport import Reply
from tests.fakes import FakeClock, FakeTransport

GPU = "GPU-abcabcab-0000-4000-8000-0000000000ab"
HEAD = {"job": "j", "rank": 0, "world_size": 1, "node": "n", "gpu_uuid": GPU, "group": None}


def test_too_few_steps_never_stand_out() -> None:
    assert stand_out_above([1.0] * 7) == math.inf
    assert stand_out_above([1.0] * 8) == 1.0 * 1.08


def test_scattered_steps_need_a_longer_step_to_stand_out() -> None:
    steady = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.01]
    scattered = [1.0, 1.3, 0.7, 1.1, 0.9, 1.25, 0.8, 1.0]
    assert stand_out_above(steady) < 1.1
    assert stand_out_above(scattered) > 1.5  # five of their spread past the median


def test_push_early_needs_a_standing_out_step_and_the_gap() -> None:
    assert push_early(1.2, 1.08, end=10.0, not_before=9.0)
    assert not push_early(1.05, 1.08, end=10.0, not_before=9.0)
    assert not push_early(1.2, 1.08, end=10.0, not_before=10.5)


def test_history_keeps_its_last_history_s_or_history_steps_if_more() -> None:
    h = StepHistory(EarlyPush(history_s=10.0, history_steps=8))
    for i in range(20):
        h.add(float(i), 3.0)  # slow steps long ago…
    for i in range(20, 40):
        h.add(float(i), 1.0)  # …then the last 20 s at 1 s
    assert h.above() == 1.08
    # Long steps (a 1.5x rank on 4 s steps, as the detection benchmark has it): a minute holds a dozen, and three
    # slow ones among them spread them enough to hide a fourth at 6.0 s; against the newest 32 it stands out.
    long = StepHistory(EarlyPush(history_s=60.0, history_steps=32))
    short = StepHistory(EarlyPush(history_s=60.0, history_steps=8))
    t = 0.0
    for d in [4.8, 5.0, 4.9, 5.1, 4.8] * 7 + [6.4, 6.7, 6.6]:
        t += d
        long.add(t, d)
        short.add(t, d)
    assert long.above() < 6.0 < short.above()


def make_pusher(transport: FakeTransport, early: EarlyPush | None,
                interval_s: float = 3600) -> tuple[deque[Record], Pusher]:
    q: deque[Record] = deque(maxlen=100)
    return q, Pusher(q, HEAD, transport, interval_s=interval_s, max_steps=50, timeout_s=1.0, clock=time.monotonic,
                     wall=time.time, early=early)


def test_an_early_push_leaves_the_regular_cadence_at_its_phase() -> None:
    rule = EarlyPush(min_gap_s=1.0)
    assert regular_after_early(10.0, 7.0, 5.0, rule) == 10.0  # the regular push stays where it was due
    assert regular_after_early(10.0, 9.5, 5.0, rule) == 15.0  # within min_gap_s of the early one: a period later
    assert regular_after_early(10.0, 9.0, 5.0, rule) == 10.0
    assert regular_after_early(10.0, 9.9, 0.25, rule) == 11.0  # short intervals skip every beat within the gap


def test_the_push_thread_keeps_its_regular_phase_after_an_early_push() -> None:
    # Restarting the cadence at each early push would line up every rank of a job (they all see the same long
    # step) into one burst per interval. Started at 0: regular push due at 3 s; an early one at ~1 s must not
    # move it to ~4 s.
    transport = FakeTransport()
    q, p = make_pusher(transport, EarlyPush(), interval_s=3.0)
    t0 = time.monotonic()
    p.start()
    try:
        time.sleep(1.0)
        q.append((0, 1.0, 1.0, 0.0, None))
        p.nudge()
        assert wait_for(lambda: len(transport.bodies) == 1)
        q.append((1, 2.0, 1.0, 0.0, None))
        assert wait_for(lambda: len(transport.bodies) == 2, limit_s=4.0)
        regular_at = time.monotonic() - t0
        assert p.early == 1
        assert regular_at < 3.8, f"the regular push came at {regular_at:.2f} s: the early push restarted the cadence"
    finally:
        p.close(timeout_s=2)


def test_the_pusher_derives_the_threshold_from_the_steps_it_took() -> None:
    q, p = make_pusher(FakeTransport(), EarlyPush())
    assert p.early_above == math.inf
    for i in range(10):
        q.append((i, float(i), 2.0, 0.0, None))
    assert p.drain(1.0) is None
    assert p.early_above == 2.0 * 1.08
    q2, off = make_pusher(FakeTransport(), None)
    for i in range(10):
        q2.append((i, float(i), 2.0, 0.0, None))
    off.drain(1.0)
    assert off.early_above == math.inf


def wait_for(cond, limit_s: float = 5.0) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def reporter(push_interval_s: float, *, push_early: bool = True,
             replies: tuple[Reply, ...] = ()) -> tuple[FakeClock, FakeTransport, Reporter]:
    """A rank's reporter on a fake clock and transport (the transport answers `replies`, then 202)."""
    clock = FakeClock(100.0)
    transport = FakeTransport(*replies)
    rep = Reporter(job="job-1", rank=1, world_size=4, node="node-a", gpu_uuid=GPU, push_interval_s=push_interval_s,
                   clock=clock, wall=lambda: clock.now + 1.7e9, transport=transport, handle_sigterm=False,
                   push_early=push_early)
    return clock, transport, rep


def test_a_step_that_stands_out_is_pushed_at_once_and_the_next_not_before_the_gap() -> None:
    clock, transport, rep = reporter(3600.0)
    try:
        for _ in range(10):
            clock.advance(0.2)
            rep.step_end()
        assert rep._pusher is not None
        rep._pusher.drain(1.0)  # what a regular push does: the threshold is now 0.216 s
        assert len(transport.bodies) == 1
        clock.advance(0.21)
        rep.step_end()  # ordinary
        time.sleep(0.2)
        assert len(transport.bodies) == 1
        clock.advance(0.3)
        rep.step_end()  # stands out: pushed at once, with the step before it
        assert wait_for(lambda: len(transport.bodies) == 2)
        assert [s["duration_s"] for s in transport.bodies[1]["steps"]] == [0.21, 0.3]
        for _ in range(3):
            clock.advance(0.3)
            rep.step_end()  # stand out too, but end within min_gap_s (1 s) of the early push
        time.sleep(0.2)
        assert len(transport.bodies) == 2
        clock.advance(0.3)
        rep.step_end()  # 1.2 s after it: pushed
        assert wait_for(lambda: len(transport.bodies) == 3)
        assert len(transport.bodies[2]["steps"]) == 4
        assert rep._pusher.early == 2
        assert transport.early == [False, True, True]  # what a node relay forwards at once
    finally:
        rep.close(timeout_s=2)
    assert transport.bodies[-1].get("final") is True and transport.early[3:] == [False] * (len(transport.early) - 3)


def test_the_retry_of_an_early_push_is_not_early() -> None:
    """An early push that failed is sent again on the retry's schedule, as a regular push: a relay forwards it with
    its interval's batch, and a rank whose relay is down never makes it hurry."""
    clock, transport, rep = reporter(3600.0, replies=(Reply(503),))
    try:
        for _ in range(10):
            clock.advance(0.2)
            rep.step_end()
        assert rep._pusher is not None
        rep._pusher.early_above = 0.216
        clock.advance(0.3)
        rep.step_end()  # stands out: pushed at once, answered 503, retried after the backoff (at most 0.5 s)
        assert wait_for(lambda: len(transport.bodies) == 2)
        assert transport.early == [True, False]
        assert wait_for(lambda: rep.stats.pushed_steps == 11)
    finally:
        rep.close(timeout_s=2)


def test_no_early_push_when_turned_off() -> None:
    clock, transport, rep = reporter(3600.0, push_early=False)
    try:
        for _ in range(10):
            clock.advance(1.0)
            rep.step_end()
        assert rep._pusher is not None
        rep._pusher.drain(1.0)
        clock.advance(5.0)
        rep.step_end()
        time.sleep(0.2)
        assert len(transport.bodies) == 1
    finally:
        rep.close(timeout_s=2)


def test_a_pending_backoff_is_not_cut_short_by_a_step_that_stands_out() -> None:
    clock, transport, rep = reporter(0.05, replies=(Reply(503),) * 3)
    try:
        for _ in range(10):
            clock.advance(1.0)
            rep.step_end()
        assert wait_for(lambda: len(transport.bodies) >= 1)  # the first attempt fails: backoff ≥ 0.25 s
        assert rep._pusher is not None
        rep._pusher.early_above = 1.08
        for _ in range(5):
            clock.advance(3.0)
            rep.step_end()
        time.sleep(0.1)
        assert len(transport.bodies) == 1  # still waiting out the backoff
    finally:
        rep.close(timeout_s=2)
