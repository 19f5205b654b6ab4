"""When to send an HTTP request again: which answers are retried, Retry-After, and capped backoff with jitter.

One schedule for every client gpumond has (the job SDK's pusher, the alert sinks) and, without jitter, for the
agent's retries of what is its node's own (NVML, the XID watcher, the kubelet). Stdlib only: the job SDK
imports it inside training containers.
"""

from __future__ import annotations

import email.utils
import math
import random
from collections.abc import Callable

# A server may ask for any pause; past this whatever was queued has long since been dropped anyway.
RETRY_AFTER_CAP_S = 300.0


def retryable(status: int) -> bool:
    """408 (request timeout), 429 (rate limited) and every 5xx: the same request may succeed later."""
    return status in (408, 429) or status >= 500


def parse_retry_after(value: str | None, now_wall: float, cap_s: float = RETRY_AFTER_CAP_S) -> float | None:
    """Seconds to wait from a Retry-After header, within [0, cap_s]; None when absent or unreadable.

    Takes delta-seconds (a fraction too: some receivers send one) and HTTP-dates, which are GMT.
    """
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None  # HTTP-dates are GMT; a zone-less date is not one
        seconds = when.timestamp() - now_wall
    # "nan" parses as a float and escapes min/max: a hostile server could make us retry in a busy loop.
    return min(max(seconds, 0.0), cap_s) if math.isfinite(seconds) else None


class Backoff:
    """The n-th failure in a row waits min(cap, base·2^(n-1)) × a random factor in [1 - jitter, 1).

    By default half fixed, half random: clients that lost a server together (ranks of one job, sink replicas)
    spread their retries out, none retries sooner than half the schedule, and the cap is never exceeded.
    `jitter=0` is the plain doubling schedule, for a retry no other client shares (a node's own driver).
    """

    def __init__(self, base_s: float, cap_s: float, rng: Callable[[], float] = random.random, *,
                 jitter: float = 0.5) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self._rng = rng
        self._jitter = jitter
        self.failures = 0

    def next_delay(self) -> float:
        """Count one more failure; the delay before the next attempt."""
        self.failures += 1
        ceiling = min(self.cap_s, self.base_s * 2.0 ** min(self.failures - 1, 60))
        return ceiling * (1.0 - self._jitter + self._jitter * self._rng())

    def after_failure(self, retry_after_s: float | None) -> float:
        """The delay after a failure: the schedule's, or the server's Retry-After when that is longer.

        Retry-After only lengthens a wait: a server answering "Retry-After: 0" (or a date already past) every
        time would otherwise be retried in a busy loop, with no backoff ever building up.
        """
        delay = self.next_delay()
        return delay if retry_after_s is None else max(retry_after_s, delay)

    def reset(self) -> None:
        """After a success."""
        self.failures = 0
