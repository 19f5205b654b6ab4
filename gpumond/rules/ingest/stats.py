"""Ingest and window counters as gpumond Series, with their types and help, for the service's /metrics."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from gpumond.rules.store import GpuStore, RankStore
from gpumond.types import Series

# name -> (type, help), in the shape the exposition renderer takes.
INGEST_METRICS: Mapping[str, tuple[str, str]] = {
    "gpumond_rules_push_requests_total": ("counter", "Push requests answered, by HTTP status code."),
    "gpumond_rules_push_steps_total": (
        "counter", "Steps received in accepted pushes, by result: accepted (new, kept), duplicate (already held), "
                   "stale (older than the window), per_rank_window (a push's oldest new steps beyond "
                   "limits.max_steps_per_rank), refused (no room under limits.max_steps_held)."),
    "gpumond_rules_push_misrouted_total": (
        "counter", "Pushes refused with 421 because their job belongs to another shard, by the shard that owns "
                   "it (the job's client routes wrongly: see GPUMOND_SHARDS in docs/job-sdk.md)."),
    "gpumond_rules_push_restarts_total": (
        "counter", "Ranks whose process restarted (a push with a new incarnation): the previous process's steps "
                   "were let go so the new one's count."),
    "gpumond_rules_cap_refusals_total": (
        "counter", "Pushes or telemetry samples refused because a cap was reached, by cap."),
    "gpumond_rules_expired_total": ("counter", "Entries dropped after expire_after_s of silence, by kind."),
    "gpumond_rules_held": ("gauge", "Entries held in the windows now, by kind."),
    "gpumond_rules_held_limit": ("gauge", "The configured cap on entries held, by kind."),
    "gpumond_rules_rate_limit_clients": ("gauge", "Clients with a rate-limit bucket (bounded by limits.max_clients)."),
}


class IngestStats:
    """Counts push outcomes and reads the stores' sizes; `series()` is what /metrics adds for ingest."""

    def __init__(self, ranks: RankStore, gpus: GpuStore | None = None) -> None:
        self._ranks = ranks
        self._gpus = gpus
        self._codes: Counter[int] = Counter()
        self._misrouted: Counter[int] = Counter()
        self.rate_limit_clients = 0

    def count(self, status: int) -> None:
        """One push answered with `status`."""
        self._codes[status] += 1

    def misrouted(self, owner: int) -> None:
        """One push refused because shard `owner` evaluates its job (its 421 is counted by `count`)."""
        self._misrouted[owner] += 1

    def requests(self, status: int) -> int:
        """Pushes answered with `status` so far."""
        return self._codes[status]

    def series(self) -> list[Series]:
        """Every ingest series, current values."""
        r = self._ranks.counts()
        out = [Series("gpumond_rules_push_requests_total", (("code", str(c)),), float(n))
               for c, n in sorted(dict(self._codes).items())]  # a copy: pushes count on another thread
        out += [_s("gpumond_rules_push_misrouted_total", n, ("shard", str(k)))
                for k, n in sorted(dict(self._misrouted).items())]
        for result, n in (("accepted", r.steps_accepted), ("duplicate", r.steps_duplicate),
                          ("stale", r.steps_stale), ("per_rank_window", r.steps_per_rank_window),
                          ("refused", r.steps_refused)):
            out.append(_s("gpumond_rules_push_steps_total", n, ("result", result)))
        out.append(_s("gpumond_rules_push_restarts_total", r.restarts))
        refused = dict(r.refused)
        expired = {k.removesuffix("s"): v for k, v in r.expired.items()}
        held = {"jobs": r.jobs, "ranks": r.ranks, "gpus": r.gpus, "steps": r.steps}
        limits = dict(self._ranks.limits)
        if self._gpus is not None:
            g = self._gpus.counts()
            refused.update(telemetry_gpus=g.refused_gpus, telemetry_nodes=g.refused_nodes)
            expired.update(telemetry_gpu=g.expired_gpus, telemetry_node=g.expired_nodes)
            held.update(telemetry_gpus=g.gpus, telemetry_nodes=g.nodes, telemetry_samples=g.samples)
            limits.update(telemetry_gpus=self._gpus.max_gpus, telemetry_nodes=self._gpus.max_gpus)
        out += [_s("gpumond_rules_cap_refusals_total", n, ("cap", k)) for k, n in refused.items()]
        out += [_s("gpumond_rules_expired_total", n, ("kind", k)) for k, n in expired.items()]
        out += [_s("gpumond_rules_held", n, ("kind", k)) for k, n in held.items()]
        out += [_s("gpumond_rules_held_limit", n, ("kind", k)) for k, n in limits.items()]
        out.append(_s("gpumond_rules_rate_limit_clients", self.rate_limit_clients))
        return out


def _s(name: str, value: float, *labels: tuple[str, str]) -> Series:
    return Series(name, tuple(labels), float(value))
