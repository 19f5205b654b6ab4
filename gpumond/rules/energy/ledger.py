"""Pure: what each job has used in joules, accumulated from GPU energy counters between readings.

A GPU's counter (NVML's total energy since the driver loaded) is read at every telemetry fetch. The energy
between two readings of one board is the counter's increase, credited to the jobs that held the board at
*both* readings (so a job is charged only for time it was seen on the GPU), split by their shares of it.
What makes this safe against the failures a fleet has:

- a GPU missing from a fetch (lost, its agent restarting or unreachable) keeps its last reading: when it
  comes back, the increase across the gap is credited once, to the jobs that held it throughout;
- a counter that went backwards was reset (driver reload, GPU reset): it counts from 0 again, so its new
  value is the energy since the reset (what Prometheus's `increase()` assumes too);
- the agent restarting does not reset the counter (the driver keeps it), so nothing is counted twice.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

Shares = tuple[tuple[str, float], ...]  # (job, share of the board) pairs, shares in (0, 1]


@dataclass(frozen=True, slots=True)
class Reading:
    """One board's energy counter at one instant (unix seconds, joules since the driver loaded)."""

    uuid: str
    t: float
    joules: float


@dataclass(frozen=True, slots=True)
class Mark:
    """The last reading of a board and who held it then."""

    t: float
    joules: float
    shares: Shares


@dataclass(frozen=True, slots=True)
class JobEnergy:
    """What one job has used since the service first saw it on a GPU."""

    joules: float = 0.0
    first_t: float | None = None  # unix seconds of the first reading that credited it
    last_t: float | None = None  # and of the last
    steps: int = 0  # steps the job completed since first_t
    samples: int = 0  # samples (or tokens) those steps processed, as the SDK was told; 0: never told
    last_step: int | None = None  # the job's highest step number at the last reading
    last_samples: int = 0  # and its ranks' samples in total then

    @property
    def seconds(self) -> float:
        return 0.0 if self.first_t is None or self.last_t is None else self.last_t - self.first_t

    @property
    def mean_power_w(self) -> float | None:
        """Energy over the time it was measured; None before two readings."""
        return self.joules / self.seconds if self.seconds > 0 else None

    @property
    def joules_per_step(self) -> float | None:
        return self.joules / self.steps if self.steps else None

    @property
    def joules_per_sample(self) -> float | None:
        return self.joules / self.samples if self.samples else None


@dataclass(frozen=True, slots=True)
class Ledger:
    """Every board's last reading and every job's energy so far."""

    marks: Mapping[str, Mark] = field(default_factory=lambda: MappingProxyType({}))
    jobs: Mapping[str, JobEnergy] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a job has got: its highest step number, and the samples its ranks reported in total (a count
    that only grows while the job runs; 0 when its SDK is not told the step's size)."""

    step: int
    samples: int = 0


def counter_increase(before: float, after: float) -> float:
    """Joules between two readings of one counter: its increase, or its new value when it was reset."""
    return after - before if after >= before else after


def advance(ledger: Ledger, readings: Iterable[Reading], holders: Mapping[str, Shares],
            progress: Mapping[str, Progress] = MappingProxyType({})) -> Ledger:
    """The ledger after one fetch: `readings` of the boards seen (a board not among them keeps its mark),
    `holders` board uuid → the jobs on it now with their shares, `progress` job → how far it has got."""
    marks = dict(ledger.marks)
    credit: dict[str, float] = {}
    seen_at: dict[str, float] = {}
    for r in readings:
        if not math.isfinite(r.joules) or r.joules < 0:
            continue  # an unusable value is no reading: the mark stays
        mark = marks.get(r.uuid)
        if mark is not None and r.t <= mark.t:
            continue  # not newer than what was counted (a repeated or late sample)
        now = holders.get(r.uuid, ())
        marks[r.uuid] = Mark(r.t, r.joules, now)
        for job, _ in now:
            seen_at[job] = max(seen_at.get(job, r.t), r.t)
        if mark is None:
            continue
        joules = counter_increase(mark.joules, r.joules)
        before = dict(mark.shares)
        for job, share in now:
            if job in before:
                credit[job] = credit.get(job, 0.0) + joules * share
    jobs = dict(ledger.jobs)
    for job, t in seen_at.items():
        e = jobs.get(job) or JobEnergy(first_t=t)
        e = replace(e, joules=e.joules + credit.get(job, 0.0), last_t=t)
        jobs[job] = _progressed(e, progress.get(job))
    return Ledger(MappingProxyType(marks), MappingProxyType(jobs))


def _progressed(e: JobEnergy, p: Progress | None) -> JobEnergy:
    """Steps and samples since the job was first seen. A step number that went back (ranks restarted from a
    checkpoint) counts from there: the steps computed again cost energy again."""
    if p is None:
        return e
    if e.last_step is None:
        return replace(e, last_step=p.step, last_samples=p.samples)
    return replace(e, steps=e.steps + max(0, p.step - e.last_step),
                   samples=e.samples + max(0, p.samples - e.last_samples), last_step=p.step, last_samples=p.samples)


def forget(ledger: Ledger, jobs: Iterable[str]) -> Ledger:
    """The ledger without these jobs (ended and reported), and without the marks of boards that no job it
    still holds was on: what it keeps is bounded by the jobs and GPUs in use."""
    gone = set(jobs)
    kept = {j: e for j, e in ledger.jobs.items() if j not in gone}
    marks = {u: m for u, m in ledger.marks.items() if any(job in kept for job, _ in m.shares)}
    return Ledger(MappingProxyType(marks), MappingProxyType(kept))
