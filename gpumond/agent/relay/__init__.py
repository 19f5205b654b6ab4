"""The node relay: this node's training ranks push to the agent, which holds their steps, fills in what they do not
know (node, GPU, job), and pushes each job's steps to its rules shard in one batch per interval (docs/job-sdk.md,
"The node relay"), and a job's at once after a rank's early push (early.py). Built by the agent when `relay.upstream`
is set; served on its own listener (`relay.listen`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import httpx

from gpumond.agent.relay.buffer import Buffer
from gpumond.agent.relay.early import Defer, EarlyRounds
from gpumond.agent.relay.endpoint import RelayEndpoint
from gpumond.agent.relay.fill import Filler
from gpumond.agent.relay.held_file import HeldFile
from gpumond.agent.relay.intake import Intake
from gpumond.agent.relay.processes import ProcessDevices
from gpumond.agent.relay.stats import RELAY_METRICS, RelayStats
from gpumond.agent.relay.upstream import Sender
from gpumond.config.agent import RelayConfig
from gpumond.types import Series
from gpumond.web.client import Access, http_client

__all__ = ["RELAY_METRICS", "HeldFile", "Relay", "session_devices"]

log = logging.getLogger("gpumond.agent.relay")

# One batch must be answered within this; a slower service is treated as not answering (held, backed off).
UPSTREAM_TIMEOUT_S = 10.0


class Relay:
    """The relay's parts, wired: listener app, buffer, sender, counters."""

    def __init__(self, config: RelayConfig, *, node: str, devices: Callable[[], Mapping[str, Iterable[int]]],
                 access: Access, defer: Defer, jobs_of: Callable[[Iterable[int]], tuple[str, ...]] | None = None,
                 clock: Callable[[], float] = time.monotonic, client: httpx.Client | None = None,
                 held: HeldFile | None = None) -> None:
        """`defer(delay_s, fn)` runs `fn` once, `delay_s` wall seconds later: the early rounds (the agent's
        scheduler)."""
        assert config.upstream is not None, "the relay runs only with an upstream"
        self.config = config
        self.stats = RelayStats(clock)
        self.buffer = Buffer(config.buffer_max_bytes, config.buffer_max_age_s, clock)
        self.devices = ProcessDevices(devices, clock)
        self.filler = Filler(node, self.devices, jobs_of)
        self._client = client or http_client(access, timeout=UPSTREAM_TIMEOUT_S,
                                             limits=httpx.Limits(max_connections=8, max_keepalive_connections=8))
        self.sender = Sender(buffer=self.buffer, stats=self.stats, upstream=config.upstream, shards=config.shards,
                             access=access, client=self._client, clock=clock)
        self.early = EarlyRounds(lambda keys: self.sender.flush(early=keys), defer, clock, self.stats)
        self.app = RelayEndpoint(Intake(self.filler, clock), self.buffer, self.stats, self.sender.refusal, self.devices,
                                 self.early.asked)
        self._access = access
        self._tls_problem: str | None = None
        self._held = held

    def start(self) -> None:
        """Take back what the last run could not deliver before it stopped: it goes first."""
        kept = self._held.load() if self._held is not None else []
        for entry in kept:
            for old in self.buffer.add(entry):
                self.stats.lost(old.rank, old.steps, "buffer_full")
        if kept:
            log.info("relay took back the pushes it held at its last stop", extra={"pushes": len(kept)})

    def flush(self) -> None:
        """One sending round (the agent's scheduler runs it every relay.interval_s)."""
        problem = self._access.refresh()  # rotated certificates are used from the next connection
        if problem is not None and problem != self._tls_problem:
            log.warning("relay.tls_config: the changed files cannot be used; keeping the previous ones",
                        extra={"error": problem})
        self._tls_problem = problem
        self.sender.flush()

    def series(self) -> list[Series]:
        """The relay's metrics for the agent's /metrics."""
        return self.stats.series(self.buffer.bytes, self.buffer.oldest_age(), self.filler.conflicts)

    def stop(self, grace_s: float) -> None:
        """Deliver what is held, for at most `grace_s`; what is left is kept for the next start (the state
        directory's relay-held.json), or, when it cannot be, dropped and logged."""
        # The sending runs on a thread of its own, waited for `grace_s` only: each send's timeouts end at the
        # deadline, but they bound each wait on the socket, not the whole answer (a service that trickles it byte
        # by byte outlasts them), and a stop that overran the supervisor's grace would be killed before keeping
        # anything. A batch still in flight then stays held (it
        # is in the buffer until answered) and is kept; if it is stored after all, the next start's copy is dropped
        # by the service as a duplicate, which the kept attempt count says is no loss.
        sending = threading.Thread(target=self.sender.flush_until, args=(time.monotonic() + grace_s,),
                                   name="relay-stop-flush", daemon=True)
        sending.start()
        sending.join(grace_s)
        left = self.buffer.held()
        in_flight = sending.is_alive()
        if not in_flight:
            self._client.close()  # else left to the exiting process: closing it under a send in flight could block
        if not left:
            return
        if self._held is not None and self._held.save(left, in_flight=in_flight):
            log.info("relay stopping with pushes not delivered; kept for the next start",
                     extra={"pushes": len(left), "path": str(self._held.path)})
        else:
            log.warning("relay stopping with pushes not delivered; they are lost (their ranks were answered)",
                        extra={"pushes": len(left), "bytes": self.buffer.bytes})


def session_devices(session: Any) -> Callable[[], dict[str, tuple[int, ...]]]:
    """Device UUID → host PIDs of its compute processes, GPUs and MIG devices, as the NVML session lists them now."""

    def read() -> dict[str, tuple[int, ...]]:
        by_index = {g.index: g.uuid for g in session.identities}
        out = {by_index[i]: pids for i, pids in session.compute_pids().items() if i in by_index}
        if session.mig_identities:
            out.update(session.mig_compute_pids())
        return out

    return read
