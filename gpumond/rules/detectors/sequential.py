"""Pure: sequential evidence, step by step against the step's peers: a rank that computes longer
than its peers (a straggler), and a rank that waits longer on its data loader (a starved rank). One test for
both; what differs is the per-step deviation and the minimum duration (a `Test`).

The looks of compute_share.py and the wait medians of io_starvation.py are medians over fixed spans (the
last 8 steps, the last minute), so a fault is seen once half of such a span holds bad steps: 30–50 s
whatever its severity, and longer for longer steps (a 2.0× straggler on 5 s steps took 52 s; 1.25× on 1 s
steps 28 s, measured in benchmarks/results/detection.md). Here every step is evidence on its own:

- per step, each rank's deviation from its group's median rank of that step: for compute, the log of its
  compute share over the median's (its compute factor: the slowest rank computes through the time its peers
  wait for it); for data wait, its wait share minus the median's (the share of the step its own loader cost
  beyond its peers'); over the noise of such deviations (the MAD of all of them in the window, floored), the
  step's deviation z;
- read back from the newest step, each step adds min(z, cap) − ref: a deviation of a few noise units adds
  up in a few steps, a marginal one (z just above ref) keeps accumulating, and an ordinary step takes
  evidence away. One step adds at most cap − ref, so no single step (a GC pause, a batch of long
  sequences, a missed prefetch) makes a finding;
- a rank is flagged when some run of its newest steps holds `h` of evidence, at least `min_steps` steps,
  with `frac` of them past ref (bad now, not a burst some seconds ago that ordinary steps since have not yet
  cancelled), and spans at least the minimum duration for its magnitude (the run's mean compute factor, or
  its mean excess wait share). Derivations in docs/detectors.md.

Such a finding has waited for its evidence already: it fires at once (Candidate.sustained), where the
median looks wait for two of three evaluations over `findings.min_duration_s`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.peer_rows import PeerRows
from gpumond.rules.detectors.stats import MAD_TO_SIGMA, row_nanmedian
from gpumond.rules.detectors.step_matrix import RecentSteps, read_steps
from gpumond.rules.types import RankWindow

_MAX_LOG_FACTOR = math.log(10.0)


@dataclass(frozen=True, slots=True)
class StepShares:
    """A job's absolute shares of its recent steps, one row per step number (oldest first), one column per rank:
    compute shares (NaN where a rank has no timed step with a comm wait of that number) and data-wait shares
    (NaN where it has no timed step of that number)."""

    ranks: tuple[int, ...]
    shares: np.ndarray  # (steps, ranks) compute share
    starts: np.ndarray  # (steps,) when each step began (its median rank's end − duration)
    ends: np.ndarray  # (steps,) when each step ended (its median rank)
    waits: np.ndarray | None = None  # (steps, ranks) data-wait share
    numbers: np.ndarray | None = None  # (steps,) each row's step number (int64, increasing)
    # The job's per-step peer medians, kept between its judgements (peer_rows): None, each found afresh.
    peers: PeerRows | None = field(default=None, compare=False)

    def row_medians(self, x: np.ndarray, key: tuple) -> np.ndarray:
        """row_nanmedian(x) of a (steps, ranks') matrix of these rows, kept between the job's judgements as
        `key` (what its cells are and which ranks its columns are) when `peers` is set."""
        if self.peers is None or self.numbers is None:
            return row_nanmedian(x)
        return self.peers.medians(key, x, self.numbers)

    def peer_medians(self, ranks: Sequence[int], of: str = "shares") -> Callable[[np.ndarray, str], np.ndarray] | None:
        """judge's `medians` for `columns(ranks, of)`: kept between the job's judgements (None without `peers`)."""
        if self.peers is None:
            return None
        ids = tuple(ranks)
        return lambda x, what: self.row_medians(x, (what, of, ids))

    def columns(self, ranks: Sequence[int], of: str = "shares") -> np.ndarray:
        """The compute shares (or `of="waits"`: data-wait shares) of these ranks (columns in this order)."""
        index = {r: i for i, r in enumerate(self.ranks)}
        x = self.shares if of == "shares" else self.waits
        assert x is not None
        return x[:, [index[r] for r in ranks]]


def step_shares(windows: Mapping[int, RankWindow], since: float,
                steps: RecentSteps | None = None, peers: PeerRows | None = None) -> StepShares | None:
    """The shares of the steps that ended since `since`, or None when the job has no timed steps there.
    `steps`: these windows already read (step_matrix.read_steps with this `since`), else they are read here.
    `peers`: the job's per-step peer medians kept from its last judgement (peer_rows), else found afresh."""
    ws = list(windows.values())
    if not ws:
        return None
    steps = steps if steps is not None else read_steps(ws, since)
    if steps is None:
        return None
    recent, depth = steps.recent, len(steps.ends)
    ends, durations, waits, numbers, comm = steps.ends, steps.durations, steps.waits, steps.numbers, steps.comm
    timed = recent & (durations > 0) & ~np.isnan(waits) & np.isfinite(numbers)
    if not timed.any():
        return None
    with np.errstate(all="ignore"):
        share = np.maximum(1.0 - (waits + comm) / durations, 0.0)
        wait = np.clip(waits / durations, 0.0, 1.0)
    nums = numbers[timed]
    lo, hi = nums.min(), nums.max()
    if hi - lo > 8 * depth + 64 or not bool((nums == np.floor(nums)).all()):
        return None  # sparse or odd step numbers: no step-aligned view (the median looks still judge)
    rows, n = int(hi - lo) + 1, timed.shape[1]
    assert n == len(ws), "steps read from other windows than these"  # a flat index would misplace them
    # Where each timed cell goes in the flat (rows, n) result, worked out once for the four fields placed: a pair
    # of index arrays is turned into flat positions again on every assignment (at 32,768 ranks × 120 steps the
    # four placements took ~1.3× as long that way).
    cells = np.flatnonzero(timed)
    at = (nums - lo).astype(np.int64) * n + cells % n

    def place(v: np.ndarray) -> np.ndarray:
        out = np.full(rows * n, np.nan)
        out[at] = v[timed]
        return out.reshape(rows, n)

    shares = place(np.where(np.isnan(comm), np.nan, share))
    waited = place(wait)
    kept = ~np.isnan(waited).all(axis=1)
    ranks = tuple(w.info.rank for w in ws)
    out = StepShares(ranks, shares[kept], np.empty(0), np.empty(0), waited[kept],
                     (np.arange(rows, dtype=np.int64) + int(lo))[kept], peers)
    with warnings.catch_warnings():  # all-NaN columns of a row cannot occur (kept); numpy warns on any NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        row_end = out.row_medians(place(ends)[kept], ("end", ranks))
        row_start = out.row_medians(place(ends - durations)[kept], ("start", ranks))
    return replace(out, starts=row_start, ends=row_end)


@dataclass(frozen=True, slots=True)
class Evidence:
    """The strongest run of a rank's newest steps that passes the test."""

    evidence: float  # Σ (min(z, cap) − ref) over the run
    steps: int
    span_s: float
    magnitude: float  # compute: its mean compute factor (exp of the mean log factor); wait: its mean excess share
    z: float  # the run's mean deviation in noise units (each step's capped at the test's cap)
    mean: float = math.nan  # the rank's mean value (compute or wait share) over the run's steps…
    peer: float = math.nan  # …and its group's median rank's, step by step, over the same steps
    start: float = math.nan  # when the run's first step began (unix s)


@dataclass(frozen=True, slots=True)
class Test:
    """One sequential test: its constants, how a step's deviation is made from the group's values, how a run's
    mean deviation reads as a magnitude, and the minimum duration (s) for that magnitude given the step time."""

    ref: float
    cap: float
    h: float
    min_steps: Callable[[np.ndarray], np.ndarray | int]  # magnitude → steps a run needs at least
    frac: float
    floor: float
    deviation: Callable[[np.ndarray, np.ndarray], np.ndarray]  # (values, the step's median) → deviation
    bound: float  # one step's deviation counts at most this much in the run's mean (a clock jump, one absurd step)
    magnitude: Callable[[np.ndarray], np.ndarray]  # a run's mean deviation → what the finding reports
    need: Callable[[np.ndarray, float], np.ndarray]  # (magnitude, step time) → minimum span (s)
    # The noise unit of a step is also at least that step's own spread over the group (its MAD across the
    # ranks): where the whole group's values scatter from step to step (a job's shared pipeline slowing, each
    # loader draining at its own pace), a window MAD that still holds the calm before counts that scatter as
    # evidence.
    row_noise: bool = False
    # Past this many noise units a step counts as evidence where that step's median rank reaches `busy_level`
    # (a job whose ranks all wait on data: each loader drains at its own pace, and a rank a little luckier than
    # its peers for a few steps in a row is no outlier); None: `ref` everywhere.
    busy_ref: float | None = None
    busy_level: float = math.inf
    # Whether `h` grows with the ranks judged together (evidence_needed): every rank of the group is tested, so
    # the group's false alarms scale with its size. Not for a test whose findings are kept only for ranks that
    # another signal already singled out (corroborated_compute_test): those are a few, whatever the group.
    grows: bool = True


def _afresh(x: np.ndarray, _what: str) -> np.ndarray:
    return row_nanmedian(x)


def compute_test(cfg: DetectorConfig) -> Test:
    """A rank computing longer than its group's median rank: log compute factor; minimum duration by factor."""
    return Test(cfg.seq_ref, cfg.seq_cap, cfg.seq_h, lambda _: cfg.seq_min_steps, cfg.seq_frac, cfg.seq_floor,
                lambda x, med: np.log(np.maximum(x, 1e-3) / np.maximum(med, 1e-3)), _MAX_LOG_FACTOR, np.exp,
                lambda factor, step_s: _compute_need(factor, step_s, cfg))


def corroborated_compute_test(cfg: DetectorConfig) -> Test:
    """compute_test for a rank whose GPU shows its own cause (a throttle reason, a low clock): the minimum
    duration is seq_short_s whatever the factor and the step time, so seq_min_steps slow steps do. The longer
    minimum (a transient's longest, plus one step it may overlap) is there for workload transients of healthy
    ranks, which slow a rank without any cause on its GPU."""
    return replace(compute_test(cfg), need=lambda factor, step_s: np.full(np.shape(factor), cfg.seq_short_s),
                   grows=False)


def wait_test(cfg: DetectorConfig) -> Test:
    """A rank waiting on its data loader longer than its group's median rank: excess wait share; minimum
    duration by that excess (see wait_min_duration_s). A missed prefetch is one step's event, so below
    seq_wait_miss_max (more than one miss costs) a run needs seq_wait_min_steps steps, past it seq_min_steps."""
    return Test(cfg.seq_ref, cfg.seq_cap, cfg.seq_h,
                lambda excess: np.where(excess < cfg.seq_wait_miss_max, cfg.seq_wait_min_steps, cfg.seq_min_steps),
                cfg.seq_frac, cfg.seq_wait_floor,
                lambda x, med: x - med, 1.0, lambda y: y,
                lambda excess, step_s: _wait_min_duration(excess, cfg), row_noise=True,
                busy_ref=cfg.seq_wait_busy_ref, busy_level=cfg.wait_min_frac)


def evidence_needed(test: Test, ranks: int, cfg: DetectorConfig) -> float:
    """The evidence a run needs in a group of `ranks` ranks judged together: `test.h` up to seq_h_ranks ranks
    (the group size h was validated on), ln(ranks / seq_h_ranks) more beyond. Under no fault a rank's evidence
    passes h with probability ~e^(−θh) (Wald's bound on a random walk with negative drift, θ the root of
    E[e^(θ·step)] = 1: 2 for Gaussian steps, less for heavy-tailed ones, taken as 1), so a group of N ranks
    passes it N / seq_h_ranks times as often as the validated one: ln(N / seq_h_ranks) / θ more keeps its rate."""
    if not test.grows or ranks <= cfg.seq_h_ranks:
        return test.h
    return test.h + math.log(ranks / cfg.seq_h_ranks)


def min_duration_s(factor: float, step_s: float, cfg: DetectorConfig) -> float:
    """How long (from the end of its first step to the end of its newest) a deviation of this mean compute
    factor must last before it is a finding, with steps of `step_s`."""
    return float(_compute_need(np.array(factor), step_s, cfg))


def wait_min_duration_s(excess: float, cfg: DetectorConfig) -> float:
    """How long (from the end of its first step to the end of its newest) a data wait this far above its
    peers' (mean excess share of the step) must last before it is a finding."""
    return float(_wait_min_duration(np.array(excess), cfg))


def _compute_need(factor: np.ndarray, step_s: float | np.ndarray, cfg: DetectorConfig) -> np.ndarray:
    """A compute run's minimum span: _min_duration, plus one step inside the transient range. Slowness of
    wall length L slows steps whose ends lie within L plus one step of each other, so a run inside the range
    must outlast the longest transient by a step. Past seq_transient_factor the step is not added: no healthy
    slowness measured lasts longer than seq_short_s (0.18 s on real DDP), and to raise two whole steps' mean
    factor to 1.8× it would have to add 0.8 of each step, which a slowness that short can do only on steps far
    shorter than seq_short_s, whose run then spans seq_short_s only over steps beyond its reach."""
    base = _min_duration(factor, cfg)
    return np.where(factor < cfg.seq_transient_factor, base + step_s, base)


def _min_duration(factor: np.ndarray, cfg: DetectorConfig) -> np.ndarray:
    """seq_short_s past the transient range; inside it seq_transient_s, and longer for smaller factors in
    inverse proportion to the excess below seq_marginal_factor: slowness of a few per cent is where two
    transients back to back (each within the range) are likeliest to pass for one long one, and where the
    median looks (a minute of steps) lose little against the sequential test."""
    excess = np.maximum(factor - 1.0, 1e-6)
    inside = cfg.seq_transient_s * np.maximum(1.0, (cfg.seq_marginal_factor - 1.0) / excess)
    return np.where(factor < cfg.seq_transient_factor, inside, cfg.seq_short_s)


def _wait_min_duration(excess: np.ndarray, cfg: DetectorConfig) -> np.ndarray:
    """seq_wait_s for an excess of seq_wait_large or more, longer in inverse proportion below it. A missed
    prefetch is one step's event, not wall time: the step count (seq_wait_min_steps) guards against those,
    this against a loader slow for a few seconds (a page cache refill) at a few per cent."""
    return cfg.seq_wait_s * np.maximum(1.0, cfg.seq_wait_large / np.maximum(excess, 1e-6))


def judge(x: np.ndarray, starts: np.ndarray, ends: np.ndarray, ranks: Sequence[int],
          cfg: DetectorConfig, test: Test | None = None, only: Collection[int] | None = None,
          medians: Callable[[np.ndarray, str], np.ndarray] | None = None) -> dict[int, Evidence]:
    """The ranks (columns of `x`, a StepShares slice of one peer group) with enough sequential evidence: on
    compute shares by default, or under another `test` (wait_test on data-wait shares). With `only`, just those
    of these ranks (the group's medians and noise are still taken over all of them). `medians(matrix, what)`: its
    per-step medians kept between judgements (StepShares.row_medians); None: row_nanmedian, found afresh."""
    medians = medians if medians is not None else _afresh
    test = test if test is not None else compute_test(cfg)
    rows, n = x.shape
    if rows == 0 or n < cfg.min_peers:
        return {}
    with np.errstate(all="ignore"), warnings.catch_warnings():  # steps no rank of the group pushed: NaN rows
        warnings.simplefilter("ignore", RuntimeWarning)
        counted = (~np.isnan(x)).sum(axis=1) >= cfg.min_peers  # a step few peers pushed is not compared
        med = medians(np.where(counted[:, None], x, np.nan), "median")
        y = test.deviation(x, med[:, None])
        y[~counted] = np.nan
        valid = ~np.isnan(y)
        if not valid.any():
            return {}
        sigma = max(MAD_TO_SIGMA * float(np.median(np.abs(y[valid]))), test.floor)
        if test.row_noise:
            sigma = np.maximum(sigma, np.nan_to_num(MAD_TO_SIGMA * medians(np.abs(y), "noise")))[:, None]
    z = np.where(valid, np.clip(y / sigma, -test.cap, test.cap), 0.0)
    ref = np.full((rows, 1), test.ref)
    if test.busy_ref is not None:
        ref[np.nan_to_num(med) >= test.busy_level] = test.busy_ref
    # Suffix sums, read from the newest step back: row j holds the run from step j to the newest.
    rev = slice(None, None, -1)
    gain = np.cumsum(np.where(valid, z - ref, 0.0)[rev], axis=0)[rev]
    # A run needs this much evidence whatever else it has: almost no rank's gain ever reaches it, so the rest of
    # the test (six more suffix sums) is taken over those columns only. Column by column, the same arithmetic.
    needed = evidence_needed(test, n, cfg)
    wanted = (gain >= needed).any(axis=0)
    if only is not None:
        wanted &= np.isin(np.asarray(ranks), np.fromiter(only, np.int64, len(only)))
    cand = np.flatnonzero(wanted)
    if not len(cand):
        return {}
    x, y, z, valid, gain = x[:, cand], y[:, cand], z[:, cand], valid[:, cand], gain[:, cand]
    steps = np.cumsum(valid[rev], axis=0)[rev]
    above = np.cumsum((valid & (z > ref))[rev], axis=0)[rev]
    refs = np.cumsum(np.where(valid, ref, 0.0)[rev], axis=0)[rev]
    # The magnitude is the deviation itself (a 3× rank is 3×, however many noise units that is), bounded so
    # that one absurd step (a share near 0 from a clock jump) cannot carry a run's mean.
    total = np.cumsum(np.where(valid, np.clip(y, -test.bound, test.bound), 0.0)[rev], axis=0)[rev]
    own = np.cumsum(np.where(valid, x, 0.0)[rev], axis=0)[rev]
    peer = np.cumsum(np.where(valid, med[:, None], 0.0)[rev], axis=0)[rev]
    # From the end of the run's first step to the end of the rank's newest (ranks push at their own moments, so
    # the job's newest steps may not be this rank's yet).
    last = np.where(valid, np.arange(rows)[:, None], -1).max(axis=0)
    span = ends[np.maximum(last, 0)][None, :] - ends[:, None]
    step_s = float(np.median(ends - starts))
    with np.errstate(all="ignore"):
        magnitude = test.magnitude(total / np.maximum(steps, 1))
    need = test.need(magnitude, step_s)
    ok = (gain >= needed) & (steps >= test.min_steps(magnitude)) \
        & (above >= test.frac * steps) & (span >= need)
    out: dict[int, Evidence] = {}
    for c in np.flatnonzero(ok.any(axis=0)).tolist():
        j = int(np.argmax(np.where(ok[:, c], gain[:, c], -math.inf)))
        k = int(steps[j, c])
        out[ranks[cand[c]]] = Evidence(round(float(gain[j, c]), 2), k, round(float(span[j, c]), 2),
                                       round(float(magnitude[j, c]), 4),
                                       round(float((gain[j, c] + refs[j, c]) / k), 2),
                                       float(own[j, c] / k), float(peer[j, c] / k), float(starts[j]))
    return out
