"""Pure: when a rank pushes before its next regular push: a step that stands out against the
rank's own recent steps.

A fault shows first as longer steps, and in a synchronous job every rank sees the longer step (they all
wait for the slow one), so all of them push early and the slow rank's peers' evidence arrives with its
own. Waiting for the regular push costs up to `push_interval_s` (5 s) of detection latency on every fault;
pushing each step at once would cost a request per step. So: the regular cadence, plus a push at once
after a step longer than usual, at most one every `min_gap_s` (a fault's first seconds then cost a
request per second per rank instead of one per five).

"Longer than usual": past the median of the rank's steps of the last `history_s` by the larger of
`min_excess` of it and `noise_units` of their spread (the MAD as a standard deviation), so that a job
whose steps scatter (uneven sequence lengths) does not push early on every other step. The median of a
minute of steps stays the healthy pace for half a minute of slow steps: long enough for the detectors'
minimum duration, so a fault's evidence keeps arriving within `min_gap_s` until it is a finding.

An early push is extra: the regular cadence keeps its phase (`regular_after_early`).

One function decides for the SDK (the reporter's training thread reads the threshold the push thread
derives) and for the detection benchmark's simulated ranks, so the benchmark measures this rule.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

_MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True, slots=True)
class EarlyPush:
    """The rule's constants (defaults: see the module's docstring and docs/job-sdk.md)."""

    min_gap_s: float = 1.0  # early pushes of one rank at least this far apart
    history_s: float = 60.0  # the rank's recent steps: those that ended this long before its newest…
    history_steps: int = 32  # …or this many newest, if more (long steps: a minute holds a dozen, and three slow
    # ones among them already spread the median absolute deviation enough to hide the fourth)…
    max_steps: int = 2048  # …and at most this many (10 ms steps: the last 20 s), bounding the push thread's cost
    min_steps: int = 8  # fewer recent steps than this (a job starting): no early push
    min_excess: float = 0.08  # a step stands out at this share longer than the median at least…
    noise_units: float = 5.0  # …and past this many of the recent steps' spread


DEFAULT = EarlyPush()


def stand_out_above(durations: Sequence[float], rule: EarlyPush = DEFAULT) -> float:
    """The step duration past which a step stands out against these recent ones; inf with too few of them."""
    n = len(durations)
    if n < rule.min_steps:
        return math.inf
    ordered = sorted(durations)
    median = _median(ordered)
    spread = _MAD_TO_SIGMA * _median(sorted(abs(d - median) for d in ordered))
    return median + max(rule.min_excess * median, rule.noise_units * spread)


def history_len(within_history_s: int, held: int, rule: EarlyPush = DEFAULT) -> int:
    """How many of a rank's newest steps stand_out_above judges against: those of the last history_s
    (`within_history_s` of the `held` steps), at least history_steps, at most max_steps."""
    return min(held, rule.max_steps, max(within_history_s, rule.history_steps))


def push_early(duration: float, above: float, end: float, not_before: float) -> bool:
    """Whether a step of `duration` ending at `end` asks for a push now: it stands out (`above`, from
    stand_out_above) and the rank's previous early push was at least min_gap_s ago (`not_before`)."""
    return duration > above and end >= not_before


def regular_after_early(due_s: float, early_s: float, interval_s: float, rule: EarlyPush = DEFAULT) -> float:
    """When the regular push is due after an early push at `early_s`: at its own phase (`due_s`, where the
    cadence had it), a period later for each beat that falls within min_gap_s of the early push.

    Restarting the cadence at each early push would line up a job's ranks: they all see the same long step (a
    checkpoint, a slow rank), push early within milliseconds of each other, and would then all push together
    every interval, one burst of the whole job's requests, until something scattered them again.
    """
    if interval_s <= 0:
        return early_s
    late = early_s + rule.min_gap_s - due_s
    return due_s + math.ceil(late / interval_s) * interval_s if late > 0 else due_s


class StepHistory:
    """A rank's recent step ends and durations, as its pushes took them (the push thread's; not thread-safe)."""

    def __init__(self, rule: EarlyPush = DEFAULT) -> None:
        self.rule = rule
        self._steps: deque[tuple[float, float]] = deque(maxlen=max(rule.max_steps, rule.history_steps))

    def add(self, end: float, duration: float) -> None:
        """One more step, in the order they ended."""
        self._steps.append((end, duration))

    def above(self) -> float:
        """stand_out_above over the rank's recent steps (history_len: the last history_s of the newest step's
        end, at least history_steps)."""
        steps = self._steps
        if not steps:
            return math.inf
        since = steps[-1][0] - self.rule.history_s
        older = sum(1 for end, _ in steps if end < since)  # the deque is in order of end; short when it matters
        keep = history_len(len(steps) - older, len(steps), self.rule)
        while len(steps) > keep:
            steps.popleft()
        return stand_out_above([d for _, d in steps], self.rule)


def _median(ordered: Sequence[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
