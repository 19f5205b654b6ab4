"""When a job is judged on the steps it pushes: as they land, at most so often per job and so much per shard. Pure.

A job is judged when new steps for it land, not at the next tick of one global schedule (a tick every 5 s made
every finding wait 2.5 s on average for nothing). Pushes that land while a job waits coalesce into one
judgement. Two bounds keep it cheap: a job is judged at most every `min_interval_s` (its ranks push at their own
moments, so a big job has a push landing every few milliseconds), and judgements on steps take at most `busy`
of one core (after one pass took d seconds the next waits d · (1 − busy) / busy), so a shard with many busy
jobs falls back to judging them less often rather than falling behind on pushes and the periodic evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Due:
    """Which waiting jobs are judged now, which wait on, and when the next of those may be judged (None: none)."""

    now: frozenset[str]
    waiting: Mapping[str, float]  # job → when its first unjudged steps landed
    next_at: float | None


def due(waiting: Mapping[str, float], judged_at: Mapping[str, float], now: float, min_interval_s: float) -> Due:
    """Split the jobs with unjudged steps (`waiting`, job → when its first such steps landed) into those judged
    now (last judged `min_interval_s` or longer ago, or never) and the rest."""
    ready, later = set(), {}
    next_at = None
    for job, landed in waiting.items():
        at = judged_at.get(job, -float("inf")) + min_interval_s
        if at <= now:
            ready.add(job)
        else:
            later[job] = landed
            next_at = at if next_at is None else min(next_at, at)
    return Due(frozenset(ready), later, next_at)


def rest_after(took_s: float, busy: float) -> float:
    """How long to wait after a pass of judgements that took `took_s` so that they use at most `busy` of a core."""
    return max(0.0, took_s * (1.0 - busy) / busy)
