"""Pure: summarise each rank's steps and each GPU's telemetry over a window into a few robust numbers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpumond.rules.detectors.stats import mad, median
from gpumond.rules.types import GpuSample, HostSample, RankWindow, StepRecord

THROTTLE_SIGNALS = ("throttle_hw_thermal", "throttle_sw_thermal", "throttle_hw_slowdown", "throttle_hw_power_brake")


@dataclass(frozen=True, slots=True)
class RankFeatures:
    """One rank over the recent window."""

    rank: int
    node: str
    gpu_uuid: str
    group: str | None
    steps: int
    step_time_s: float | None  # median step duration
    wait_frac: float | None  # median data_wait / duration
    last_end: float | None  # unix s of the newest step end seen (any window)
    last_push: float
    wait_mean: float | None = None  # mean data_wait / duration: reacts to a new wait as soon as the energy mean does
    # Compute share 1 − (data_wait + comm_wait) / duration, for ranks that push comm_wait_s (see compute_share.py):
    share_short: float | None = None  # median of the last `short_steps` recent steps that have one
    share_recent: float | None = None  # median of all recent steps that have one
    share_trimmed: float | None = None  # their mean with `trim` of them cut off each end (the long look's input)
    # Absolute shares of the step, 0–1, for people (/metrics, the Job dashboard): medians over the recent steps
    # that have a comm wait (at least min_steps of them). share_* above are relative to the step's mean.
    compute_frac: float | None = None  # median 1 − (data_wait + comm_wait) / duration
    comm_frac: float | None = None  # median comm_wait / duration
    # How much the rank's share moves from step to step: the median absolute deviation of its recent relative
    # shares from their median (share_recent). The steps' own noise, which sets how far apart the ranks' medians
    # of a few steps fall by chance (straggler.py's noise floor on the looks).
    share_spread: float | None = None
    share_n: int = 0  # how many steps the recent look's median is of (timed, with a comm wait)
    share_short_n: int = 0  # how many the short look's is of
    # A rank on a MIG slice: the slice's profile (e.g. 3g.40gb), "mig" while no agent has said which.
    # Ranks are peers only on the same kind of device: a 1g slice is not a slow 7g one.
    mig_profile: str | None = None

    @property
    def peers(self) -> tuple[str | None, str | None]:
        """The key of this rank's peer group: the job's own group, then the device kind."""
        return self.group, self.mig_profile


@dataclass(frozen=True, slots=True)
class GpuFeatures:
    """One GPU over the recent window; None where the agent did not export the signal."""

    uuid: str
    node: str
    samples: int
    up: bool
    clock_ratio: float | None  # SM clock / max SM clock
    power_ratio: float | None  # power / enforced limit
    utilization: float | None
    temperature_c: float | None
    throttle_frac: float | None  # fraction of samples with a thermal/slowdown/brake reason active
    throttle_reasons: tuple[str, ...] = ()
    # When its newest live sample was taken, if that sample and the live one before it both show a
    # thermal/slowdown/brake reason (else None): a cause on the GPU *now*, which the window's fraction above
    # shows only once it has lasted ~18 s of the minute. Two samples, not one: the everyday fleet shows a brief
    # sw thermal bit in ~1 sample of 1,000, and one such sample beside a healthy rank's transient slowness
    # would pass for a cause.
    throttled_newest: float | None = None


@dataclass(frozen=True, slots=True)
class HostFeatures:
    """A node's host evidence over the window."""

    node: str
    cpu_utilization: float | None
    cpu_iowait: float | None
    disk_read_bytes_per_s: float | None


def _recent(steps: Sequence[StepRecord], since: float) -> list[StepRecord]:
    return [s for s in steps if s.end >= since]


def trim_count(n: int, trim: float) -> int:
    """How many of n values a trimmed mean cuts off each end: floor(trim · n), but at least one while three or
    more remain to cut from. A trim is there so that one step (a GC pause, a batch of long sequences) cannot move
    the mean; floor(0.1 · n) cut nothing below 10 steps (a 60 s window of 6 s steps), and there a single long
    batch sat in every window that held it."""
    return max(int(trim * n), 1) if trim > 0 and n >= 3 else int(trim * n)


def trimmed_mean(xs: Sequence[float], trim: float) -> float:
    """Mean of `xs` without the trim_count(n, trim) smallest and largest values (summed smallest first)."""
    s = sorted(xs)
    g = trim_count(len(s), trim)
    kept = s[g:len(s) - g]
    total = 0.0
    for x in kept:
        total += x
    return total / len(kept)


# Shares are summed per step at this resolution: sums of multiples of 2**-30 below 2**23 are exact in any
# order, so the per-rank reference and the vectorised path (rank_batch) get bit-identical means.
SHARE_QUANTUM = 2.0**30


def step_share(s: StepRecord) -> float:
    """A step's compute share 1 − (data wait + comm wait) / duration (timed steps with a comm wait)."""
    return max(1.0 - (s.data_wait_s + s.comm_wait_s) / s.duration_s, 0.0)  # type: ignore[operator]


def step_share_means(windows: Iterable[RankWindow], since: float) -> dict[float, float]:
    """Each step number's mean compute share over the ranks that pushed it (steps that ended since `since`).

    A rank's share is compared with its peers' *in the same step*: what slows every rank's step (the input
    mix, another rank's transient that everyone waits for) moves every share of that step together, and
    taken out it no longer spreads each rank's share over a wide range, in which a few slow steps of one
    rank would move its median by a lot."""
    sums: dict[float, float] = {}
    counts: dict[float, int] = {}
    for w in windows:
        for s in w.steps:
            if s.end >= since and s.duration_s > 0 and s.comm_wait_s is not None:
                sums[s.step] = sums.get(s.step, 0.0) + round(step_share(s) * SHARE_QUANTUM) / SHARE_QUANTUM
                counts[s.step] = counts.get(s.step, 0) + 1
    return {k: v / counts[k] for k, v in sums.items()}


def rank_features(w: RankWindow, since: float, short_steps: int = 8, min_steps: int = 5,
                  trim: float = 0.1, short_s: float = 0.0,
                  step_means: Mapping[float, float] | None = None) -> RankFeatures:
    """Median step time, data-wait fraction and compute share of the steps that ended since `since`
    (a compute-share look needs at least `min_steps` steps with a comm wait, the short one
    min(short_steps, min_steps)); the short look takes the last `short_steps` of them and every one that
    ended within `short_s` of the newest. With `step_means` (step_share_means of the job) each step's share
    is taken relative to its step's mean."""
    recent = _recent(w.steps, since)
    durations = [s.duration_s for s in recent if s.duration_s > 0]
    waits = [min(s.data_wait_s / s.duration_s, 1.0) for s in recent if s.duration_s > 0]
    timed = [s for s in recent if s.duration_s > 0 and s.comm_wait_s is not None]
    shares = [step_share(s) for s in timed]
    absolute = shares
    comm = [s.comm_wait_s / s.duration_s for s in timed]  # type: ignore[operator]
    if step_means is not None:
        shares = [x - step_means[s.step] for s, x in zip(timed, shares)]
    newest = max(s.end for s in timed) if timed else 0.0  # the latest end, whatever order the steps came in
    short = [x for i, (s, x) in enumerate(zip(timed, shares))
             if i >= len(shares) - short_steps or s.end >= newest - short_s]
    return RankFeatures(
        rank=w.info.rank, node=w.info.node, gpu_uuid=w.info.gpu_uuid, group=w.info.group,
        steps=len(recent),
        step_time_s=median(durations) if durations else None,
        wait_frac=median(waits) if waits else None,
        last_end=max((s.end for s in w.steps), default=None),
        last_push=w.last_push,
        wait_mean=sum(waits) / len(waits) if waits else None,
        share_short=median(short) if shares and len(shares) >= min(short_steps, min_steps) else None,
        share_recent=median(shares) if shares and len(shares) >= min_steps else None,
        share_spread=mad(shares) if shares and len(shares) >= min_steps else None,
        share_n=len(shares), share_short_n=len(short),
        share_trimmed=trimmed_mean(shares, trim) if shares and len(shares) >= min_steps else None,
        compute_frac=median(absolute) if shares and len(shares) >= min_steps else None,
        comm_frac=median(comm) if shares and len(shares) >= min_steps else None,
    )


def _med(samples: Sequence[GpuSample], key: str) -> float | None:
    xs = [s.values[key] for s in samples if key in s.values]
    return median(xs) if xs else None


def _ratio(samples: Sequence[GpuSample], num: str, den: str) -> float | None:
    xs = [s.values[num] / s.values[den] for s in samples
          if num in s.values and s.values.get(den, 0) > 0]
    return median(xs) if xs else None


def _energy_power_ratio(samples: Sequence[GpuSample]) -> float | None:
    """Mean power over the window from the energy counter (exact, immune to sampling/step aliasing)."""
    xs = [(s.t, s.values["energy_j"], s.values.get("power_limit_w", 0.0)) for s in samples if "energy_j" in s.values]
    if len(xs) < 3 or xs[-1][0] <= xs[0][0] or xs[-1][1] < xs[0][1]:
        return None
    limit = median([x[2] for x in xs])
    return (xs[-1][1] - xs[0][1]) / (xs[-1][0] - xs[0][0]) / limit if limit > 0 else None


def gpu_features(uuid: str, samples: Sequence[GpuSample]) -> GpuFeatures:
    """Medians of clock ratio, power ratio, utilization, temperature, and how often it was throttled."""
    live = [s for s in samples if s.up]
    node = samples[-1].node if samples else ""
    if not live:
        return GpuFeatures(uuid, node, 0, bool(samples) and samples[-1].up, None, None, None, None, None)
    throttled = [s for s in live if _shows_cause(s)]
    has_throttle = any(k in s.values for s in live for k in THROTTLE_SIGNALS)
    reasons = sorted({k.removeprefix("throttle_") for s in throttled for k in THROTTLE_SIGNALS
                      if s.values.get(k, 0) >= 0.5})
    return GpuFeatures(
        uuid=uuid, node=node, samples=len(live), up=samples[-1].up,
        # An idle GPU's clock drops (gpu_idle): compare clocks only while kernels run, else a checkpoint
        # write or a data wait reads as throttling.
        clock_ratio=_ratio([s for s in live if s.values.get("utilization", 1.0) >= 0.5] or live,
                           "sm_clock_hz", "sm_clock_max_hz"),
        power_ratio=_energy_power_ratio(live) or _ratio(live, "power_w", "power_limit_w"),
        utilization=_med(live, "utilization"),
        temperature_c=_med(live, "temperature_c"),
        throttle_frac=(len(throttled) / len(live)) if has_throttle else None,
        throttle_reasons=tuple(reasons),
        throttled_newest=live[-1].t if len(live) >= 2 and _shows_cause(live[-1]) and _shows_cause(live[-2]) else None,
    )


def _shows_cause(s: GpuSample) -> bool:
    return any(s.values.get(k, 0) >= 0.5 for k in THROTTLE_SIGNALS)


def host_features(node: str, samples: Sequence[HostSample]) -> HostFeatures:
    """Median CPU and iowait; disk read rate from the first and last counter in the window."""
    if not samples:
        return HostFeatures(node, None, None, None)

    def med(key: str) -> float | None:
        xs = [s.values[key] for s in samples if key in s.values]
        return median(xs) if xs else None

    rate = None
    disk = [(s.t, s.values["disk_read_bytes_total"]) for s in samples if "disk_read_bytes_total" in s.values]
    if len(disk) >= 2 and disk[-1][0] > disk[0][0] and disk[-1][1] >= disk[0][1]:
        rate = (disk[-1][1] - disk[0][1]) / (disk[-1][0] - disk[0][0])
    return HostFeatures(node, med("cpu_utilization"), med("cpu_iowait"), rate)


def job_step_times(ranks: Mapping[int, RankWindow], since: float, until: float) -> list[float]:
    """Per-step job time (the slowest rank's duration for each step number) for steps ending in [since, until)."""
    per_step: dict[int, float] = {}
    for w in ranks.values():
        for s in w.steps:
            if since <= s.end < until:
                per_step[s.step] = max(per_step.get(s.step, 0.0), s.duration_s)
    return [per_step[k] for k in sorted(per_step)]
