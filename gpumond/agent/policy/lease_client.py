"""Asks the rules service for this node's power-slack offers, on the agent's schedule, and holds the leases.

The agent stays the only process that sets a limit: it pulls; the rules service never reaches into a node.
A failed or unreadable answer renews nothing (logged when it starts failing and when it recovers), so the
leases run out `lease_s` after the last good answer and every GPU goes back to the limit it would otherwise
have. Leases live in memory only: a restarted agent holds none.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping

import httpx

from gpumond.agent.policy.lease import Guard, Leases, OfferError, expire, parse_offers, renew
from gpumond.web.bounded import FetchError, get_bounded
from gpumond.web.client import Access, AccessError, http_client

log = logging.getLogger("gpumond.policy")

OFFERS_PATH = "/api/v1/power/offers"
# A node's offers are a few hundred bytes a GPU: an answer larger than this is broken (or hostile) and is not held.
MAX_OFFERS_BYTES = 1 << 20


class LeasePuller:
    """`poll()` once per interval (the agent's scheduler); `leases()` for the policy engine, any thread."""

    def __init__(self, url: str, node: str, *, lease_s: float, guard: Guard, clock: Callable[[], float],
                 applied: Callable[[], Mapping[str, float]], timeout_s: float = 5.0,
                 access: Access | None = None, client: httpx.Client | None = None) -> None:
        self._url = url.rstrip("/") + OFFERS_PATH
        self._node = node
        self._lease_s = lease_s
        self._guard = guard
        self._clock = clock
        self._applied = applied
        self._access = access if access is not None else Access()
        self._timeout_s = timeout_s
        self._client = client if client is not None else http_client(self._access, timeout=timeout_s)
        self._lock = threading.Lock()
        self._leases = Leases()
        self._failing: str | None = None
        self.answers = 0
        self.failures = 0

    def poll(self) -> None:
        """One answer: renew (or withdraw) the leases; a failure renews nothing. Never raises."""
        try:
            if (problem := self._access.refresh()) is not None:
                log.warning("power-slack client certificate files unusable: the previous ones stay",
                            extra={"error": problem})
            status, body = get_bounded(self._client, self._url, params={"node": self._node},
                                       headers=self._access.headers(), timeout_s=self._timeout_s,
                                       max_bytes=MAX_OFFERS_BYTES)
            if status != 200:
                raise OfferError(f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}")
            offers = parse_offers(json.loads(body))
        # RecursionError: JSON nested deeper than the parser recurses (a few kilobytes of "[[[…").
        except (FetchError, OfferError, AccessError, ValueError, RecursionError) as e:
            self.failures += 1
            problem = f"{type(e).__name__}: {e}"[:300]
            if self._failing is None:
                log.warning("power-slack offers cannot be read: leases run out unless renewed", extra={
                    "url": self._url, "error": problem})
            self._failing = problem
            return
        now = self._clock()
        applied = self._applied()  # before our lock: the engine holds its own while it asks for leases()
        with self._lock:
            self._leases = renew(self._leases, offers, applied, now, self._lease_s, self._guard)
        self.answers += 1
        if self._failing is not None:
            log.info("power-slack offers readable again", extra={"url": self._url})
            self._failing = None

    def leases(self) -> Leases:
        """The leases that have not run out."""
        with self._lock:
            self._leases = expire(self._leases, self._clock())
            return self._leases

    def close(self) -> None:
        self._client.close()
