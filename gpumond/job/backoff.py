"""How long to wait before retrying a push: capped exponential backoff with jitter, or Retry-After."""

from __future__ import annotations

import email.utils
import random
from collections.abc import Callable

BASE_S = 0.5
CAP_S = 30.0
# A server may ask for any pause; past this the queue has long since overflowed anyway.
RETRY_AFTER_CAP_S = 300.0


def backoff_s(attempt: int, rand: Callable[[], float] = random.random,
              base_s: float = BASE_S, cap_s: float = CAP_S) -> float:
    """Delay before retry `attempt` (1 = first retry): min(cap, base·2^(attempt-1)) × a jitter in [0.5, 1)."""
    ceiling = min(cap_s, base_s * 2.0 ** min(max(attempt, 1) - 1, 60))
    # Half fixed, half random: ranks of one job that lost the service together spread their
    # retries out, and none retries sooner than half the schedule.
    return ceiling * (0.5 + 0.5 * rand())


def parse_retry_after(value: str | None, now_wall: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date), clamped; None if absent or bad."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        seconds = float(text)
    else:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None  # HTTP-dates are GMT; a zone-less date is not one
        seconds = when.timestamp() - now_wall
    return min(max(seconds, 0.0), RETRY_AFTER_CAP_S)
