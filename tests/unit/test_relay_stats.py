"""The relay's per-rank bookkeeping stays bounded whatever ranks a client claims to be, scraped or not."""

from __future__ import annotations

from collections import Counter

from gpumond.agent.relay.stats import MAX_SEEN, RANKS_WINDOW_S, RelayStats
from tests.fakes import FakeClock


def ranks_gauge(stats: RelayStats) -> float:
    return next(s.value for s in stats.series(0, 0.0, Counter()) if s.name == "gpumond_relay_ranks")


def test_ranks_seen_are_bounded_without_a_scrape() -> None:
    """Any client that reaches the relay names its own (job, rank): a stream of made-up ones must not grow the
    agent's memory while nothing scrapes /metrics (the only place the old ones were forgotten)."""
    clock = FakeClock()
    stats = RelayStats(clock)
    for rank in range(MAX_SEEN + 5_000):
        stats.took(("flood", rank), 1)
    assert ranks_gauge(stats) == MAX_SEEN  # the most recent ones


def test_a_rank_is_counted_for_a_window_after_its_last_push() -> None:
    clock = FakeClock()
    stats = RelayStats(clock)
    stats.took(("j", 0), 1)
    stats.took(("j", 1), 1)
    clock.advance(RANKS_WINDOW_S / 2)
    stats.took(("j", 0), 1)  # pushed again: its window starts again
    clock.advance(RANKS_WINDOW_S / 2 + 1)
    stats.took(("j", 2), 1)
    assert ranks_gauge(stats) == 2  # ranks 0 and 2; rank 1 last pushed more than a window ago
