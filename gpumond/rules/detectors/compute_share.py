"""Pure: each rank's compute share of its steps, from the waits the job pushes, at three time scales.

In a synchronous step every rank waits for the slowest one in the step's collectives, so a rank's
`comm_wait_s` is how long *it* waited for its peers. What is left of the step once data wait and
collective wait are taken out is the time the rank itself was busy:

    compute_share = 1 − (data_wait_s + comm_wait_s) / duration_s

A slow GPU computes through the time its peers spend waiting for it, so its share sits above theirs even
when no telemetry shows why (no throttle reason, power inside silicon variation). A rank starved by its
data loader is not flagged by this: its data wait is taken out with the collective wait.

Three looks trade latency for sensitivity (a 1.25× straggler is obvious in a few steps; a 1.05× one
only over minutes of steps):
- `short`: median over the rank's last `short_steps` steps;
- `recent`: median over the steps that ended in the detectors' recent window;
- `long`: mean of the `recent` medians this rank had at the last `long_evals` evaluations (kept in the
  detector state, so a long look costs no more than a short one to compute).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpumond.rules.detectors.stats import median
from gpumond.rules.types import RankWindow

LOOKS = ("short", "recent", "long")


@dataclass(frozen=True, slots=True)
class Shares:
    """One rank's compute share at the three looks; None where there were too few steps with a comm wait."""

    short: float | None
    recent: float | None
    long: float | None
    history: tuple[float, ...]  # the `recent` medians of the last evaluations, oldest first (state)

    def look(self, name: str) -> float | None:
        """The value of one look by name."""
        return getattr(self, name)


def rank_shares(w: RankWindow, since: float, previous: tuple[float, ...], short_steps: int, min_steps: int,
                long_evals: int) -> Shares:
    """A rank's compute shares; `previous` is its history from the last evaluation (empty at first)."""
    recent: list[float] = []
    for s in w.steps:
        cw = s.comm_wait_s
        if cw is None or s.end < since or s.duration_s <= 0:
            continue
        share = 1.0 - (s.data_wait_s + cw) / s.duration_s
        recent.append(share if share > 0.0 else 0.0)
    short = median(recent[-short_steps:]) if len(recent) >= min(short_steps, min_steps) else None
    mid = median(recent) if len(recent) >= min_steps else None
    history = previous if mid is None else (previous + (mid,))[-long_evals:]
    # The long look only once it spans more than the recent window (else it says what `recent` says).
    long = sum(history) / len(history) if len(history) >= min_steps else None
    return Shares(short, mid, long, history)


def job_shares(ranks: Mapping[int, RankWindow], since: float, previous: Mapping[int, tuple[float, ...]],
               short_steps: int, min_steps: int, long_evals: int) -> dict[int, Shares]:
    """Shares of every rank of a job that pushes comm waits; empty when none of its ranks does."""
    out = {}
    for rank, w in ranks.items():
        sh = rank_shares(w, since, previous.get(rank, ()), short_steps, min_steps, long_evals)
        if sh.short is not None or sh.history:
            out[rank] = sh
    return out
