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
- `short`: median over the rank's last `share_short_steps` recent steps, or over those of the last
  `share_short_s` seconds when that is more (fast steps: 8 steps of 50 ms are half a second, which one
  descheduled thread fills; measured on real DDP) (a rank feature);
- `recent`: median over the steps that ended in the detectors' recent window (a rank feature);
- `long`: median of the rank's trimmed-mean shares (10 % cut off each end) at the evaluations of the last
  `share_long_s` (5 minutes of wall time, not a count of evaluations: at a 1 s interval 30 evaluations
  would be 30 s, all of whose windows share the same steps), kept in the detector state so a long look
  costs no more than a short one to compute; it needs `min_steps` evaluations spanning `share_long_min_s`.
  Each evaluation's value is a mean over its window's steps, because a 1.05× straggler moves the share by
  ~2 % against ~3 % of per-step noise and a median over steps wastes a third of them; trimmed (at least
  one step off each end, features.trim_count), so a GC pause or a batch of long sequences cannot move it.
  Across evaluations a median, not a mean: a healthy
  rank whose node had a few transients back to back weighs in every window that holds them (a minute of
  evaluations), and a mean over five minutes carried that into the long look (a fault-free rank at 1,024
  nodes reached z 5.51 against a threshold of 5.57; the median gave 2.07), while a straggler is slow in
  every window and its median is as far out as its mean (the 1.03× and 1.05× ones kept their z). Only
  full windows count: in a job's first `recent_s` every evaluation's window holds the job's first steps,
  so a node slowed for a few seconds at the start (warm-up on a busy host) would weigh in all of them and
  keep the long look apart for minutes after it ended.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpumond.rules.detectors.features import RankFeatures
from gpumond.rules.detectors.stats import median

LOOKS = ("short", "recent", "long")


@dataclass(frozen=True, slots=True)
class Shares:
    """One rank's compute share at the three looks; None where there were too few steps (or evaluations)."""

    short: float | None
    recent: float | None
    long: float | None
    history: tuple[float, ...]  # the trimmed-mean shares of the last evaluations, oldest first (state)

    def look(self, name: str) -> float | None:
        """The value of one look by name."""
        return getattr(self, name)


def rank_shares(r: RankFeatures, previous: tuple[float, ...], min_evals: int, long_evals: int,
                add: bool = True, ready: bool = True) -> Shares:
    """A rank's looks; `previous` is its history from the last evaluation (empty at first), of which the last
    `long_evals` are kept. This evaluation's window joins it when `add` (a full window), and the long look
    is given when `ready` (the history spans long enough) and it holds `min_evals` evaluations."""
    history = (previous + (r.share_trimmed,) if add and r.share_trimmed is not None else previous)[-long_evals:] \
        if long_evals > 0 else ()
    # The long look only once it spans well beyond the recent window (else it says what `recent` says).
    long = median(history) if ready and len(history) >= min_evals else None
    return Shares(r.share_short, r.share_recent, long, history)


def job_shares(feats: Sequence[RankFeatures], previous: Mapping[int, tuple[float, ...]], min_evals: int,
               long_evals: int, add: bool = True, ready: bool = True) -> dict[int, Shares]:
    """Shares of every rank that pushes comm waits (or did within the long look); empty for other jobs."""
    out = {}
    for r in feats:
        prev = previous.get(r.rank, ())
        if r.share_short is None and r.share_recent is None and not prev:
            continue
        out[r.rank] = rank_shares(r, prev, min_evals, long_evals, add, ready)
    return out
