"""Token-bucket rate limit per client, over a bounded LRU of buckets."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable


class RateLimiter:
    """`rate` pushes per second per client with bursts of `burst`; at most `max_clients` buckets held."""

    # Evicting the least recently seen client forgets its debt, so it starts again with a full
    # bucket: an attacker cycling through addresses can only make the limit more lenient for
    # others, never make memory grow.

    def __init__(self, rate: float, burst: int, max_clients: int, clock: Callable[[], float]) -> None:
        if rate <= 0 or burst < 1 or max_clients < 1:
            raise ValueError("rate must be > 0, burst and max_clients >= 1")
        self._rate = rate
        self._burst = float(burst)
        self._max = max_clients
        self._clock = clock
        self._buckets: OrderedDict[Hashable, list[float]] = OrderedDict()  # client -> [tokens, last]
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, client: Hashable) -> float:
        """Spend one token: 0.0 when allowed, else the seconds until one will be available."""
        now = self._clock()
        bucket = self._buckets.get(client)
        if bucket is None:
            if len(self._buckets) >= self._max:
                self._buckets.popitem(last=False)
                self.evicted += 1
            bucket = self._buckets[client] = [self._burst, now]
        else:
            self._buckets.move_to_end(client)
            # max(0, …): a wall clock stepped backwards must not drain the bucket.
            bucket[0] = min(self._burst, bucket[0] + max(0.0, now - bucket[1]) * self._rate)
            bucket[1] = now
        if bucket[0] >= 1.0:
            bucket[0] -= 1.0
            return 0.0
        return (1.0 - bucket[0]) / self._rate


def retry_after(seconds: float) -> str:
    """A Retry-After value: whole seconds, rounded up, at least 1."""
    return str(max(1, math.ceil(seconds)))
