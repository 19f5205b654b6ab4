"""Token buckets per client: bursts, refill, Retry-After, and a bounded number of buckets."""

from __future__ import annotations

import pytest

from gpumond.rules.ingest.ratelimit import RateLimiter, retry_after
from tests.fakes import FakeClock


def test_a_burst_then_the_steady_rate() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate=2.0, burst=3, max_clients=10, clock=clock)
    assert [limiter.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("a") == pytest.approx(0.5)
    clock.now += 0.5
    assert limiter.take("a") == 0.0
    assert limiter.take("a") == pytest.approx(0.5)
    clock.now += 100  # refills only up to the burst
    assert [limiter.take("a") for _ in range(4)][-1] > 0


def test_clients_are_limited_separately() -> None:
    limiter = RateLimiter(rate=1.0, burst=1, max_clients=10, clock=FakeClock())
    assert limiter.take(("token#0", "10.0.0.1")) == 0.0
    assert limiter.take(("token#0", "10.0.0.1")) > 0
    assert limiter.take(("token#0", "10.0.0.2")) == 0.0
    assert limiter.take(("token#1", "10.0.0.1")) == 0.0


def test_buckets_are_bounded_and_the_least_recent_is_evicted() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate=1.0, burst=1, max_clients=3, clock=clock)
    for client in "abc":
        limiter.take(client)
    limiter.take("a")  # a is now the most recent
    for i in range(1000):
        limiter.take(f"attacker-{i}")
        assert len(limiter) <= 3
    assert limiter.evicted == 1000
    # Eviction only ever forgives: a forgotten client starts with a full bucket.
    assert limiter.take("b") == 0.0


def test_a_clock_stepping_back_does_not_drain_the_bucket() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate=1.0, burst=2, max_clients=3, clock=clock)
    limiter.take("a")
    clock.now -= 3600
    assert limiter.take("a") == 0.0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        RateLimiter(rate=0, burst=1, max_clients=1, clock=FakeClock())


@pytest.mark.parametrize(("seconds", "header"), [(0.01, "1"), (1.0, "1"), (1.2, "2"), (30.0, "30")])
def test_retry_after_is_whole_seconds_rounded_up(seconds: float, header: str) -> None:
    assert retry_after(seconds) == header
