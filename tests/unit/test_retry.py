"""The one retry schedule and Retry-After reading shared by the job SDK and the alert sinks."""

from __future__ import annotations

import email.utils
import random

import pytest

from gpumond.wire.retry import RETRY_AFTER_CAP_S, Backoff, parse_retry_after, retryable

NOW = 1_700_000_000.0


@pytest.mark.parametrize("status, expected", [(408, True), (429, True), (500, True), (503, True), (599, True),
                                              (400, False), (401, False), (404, False), (413, False),
                                              (421, False), (422, False)])
def test_retryable_statuses(status: int, expected: bool) -> None:
    assert retryable(status) is expected


@pytest.mark.parametrize("value, seconds", [("3", 3.0), (" 7 ", 7.0), ("0", 0.0), ("2.5", 2.5), ("-3", 0.0),
                                            ("999999", RETRY_AFTER_CAP_S), (None, None), ("soon", None),
                                            ("", None), ("nan", None), ("inf", None),
                                            ("Wed, 21 Oct 2015 07:28:00", None)])  # a date without GMT
def test_retry_after_delta_seconds(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value, NOW) == seconds


def test_retry_after_http_dates() -> None:
    assert parse_retry_after(email.utils.formatdate(NOW + 12, usegmt=True), NOW) == pytest.approx(12.0)
    assert parse_retry_after(email.utils.formatdate(NOW - 60, usegmt=True), NOW) == 0.0
    assert parse_retry_after(email.utils.formatdate(NOW + 10_000, usegmt=True), NOW, cap_s=60.0) == 60.0


def test_backoff_doubles_to_its_cap() -> None:
    high = Backoff(base_s=0.5, cap_s=30.0, rng=lambda: 1.0)  # jitter factor exactly 1
    assert [high.next_delay() for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    low = Backoff(base_s=0.5, cap_s=30.0, rng=lambda: 0.0)  # factor 0.5: never sooner than half the schedule
    assert [low.next_delay() for _ in range(3)] == [0.25, 0.5, 1.0]
    many = Backoff(base_s=1.0, cap_s=60.0, rng=lambda: 1.0)
    many.failures = 10**6
    assert many.next_delay() == 60.0  # no overflow after a long outage


def test_backoff_jitter_spreads_retries_within_half_to_one_step() -> None:
    rng = random.Random(7)
    delays = []
    for _ in range(200):
        b = Backoff(base_s=0.5, cap_s=30.0, rng=rng.random)
        b.failures = 3
        delays.append(b.next_delay())  # the 4th failure: step 4 s
    assert 2.0 <= min(delays) and max(delays) < 4.0
    assert len({round(d, 3) for d in delays}) > 100


def test_retry_after_lengthens_the_schedule_but_never_shortens_it() -> None:
    b = Backoff(base_s=1.0, cap_s=60.0, rng=lambda: 1.0)
    assert b.after_failure(7.0) == 7.0
    assert b.after_failure(0.0) == 2.0  # "Retry-After: 0" (or a past date): the schedule, never a busy loop
    assert b.after_failure(None) == 4.0  # the failures answered with Retry-After still count
    assert b.after_failure(3.0) == 8.0  # the backoff built up so far stands
    b.reset()
    assert b.failures == 0 and b.after_failure(None) == 1.0


def test_retry_after_zero_every_time_still_backs_off_to_the_cap() -> None:
    b = Backoff(base_s=0.5, cap_s=30.0, rng=lambda: 0.0)  # the shortest jitter
    delays = [b.after_failure(0.0) for _ in range(12)]
    assert delays[0] == 0.25 and delays[-1] == 15.0
    assert sum(delays) > 100  # 12 answers "retry now" take minutes, not 12 × 50 ms


def test_backoff_without_jitter_is_the_plain_doubling_schedule() -> None:
    b = Backoff(base_s=2.0, cap_s=8.0, rng=lambda: 0.0, jitter=0.0)  # whatever the rng says
    assert [b.next_delay() for _ in range(5)] == [2.0, 4.0, 8.0, 8.0, 8.0]
    b.reset()
    assert b.next_delay() == 2.0
