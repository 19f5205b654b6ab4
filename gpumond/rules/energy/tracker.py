"""Energy per job in the running service: fed every telemetry batch, read by /metrics, the jobs API and the
log line written when a job ends."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping

from gpumond.rules.energy import attribution
from gpumond.rules.energy.ledger import JobEnergy, Ledger, advance, forget
from gpumond.rules.types import RankWindow, TelemetryBatch
from gpumond.types import Series

log = logging.getLogger("gpumond.rules")

ENDED_KEPT = 256  # ended jobs the API still shows (their record is also in the log)

ENERGY_METRICS = {
    "gpumond_job_energy_joules_total": ("counter", "Energy the job's GPUs used since the service first saw it "
                                                   "on them (MIG slices: their share of the board)."),
    "gpumond_job_power_watts": ("gauge", "The job's mean power over that time: its energy over the time measured."),
    "gpumond_job_energy_per_step_joules": ("gauge", "The job's energy over the steps it completed in that time."),
    "gpumond_job_energy_per_sample_joules": ("gauge", "The job's energy over the samples (or tokens) its ranks "
                                                      "reported for those steps; only jobs that report them."),
}

Jobs = Mapping[str, Mapping[int, RankWindow]]


def record(job: str, e: JobEnergy) -> dict[str, object]:
    """What a job has used, as the API and the job-end log line say it (a value not yet known is None)."""
    def r(v: float | None, digits: int) -> float | None:
        return None if v is None else round(v, digits)
    return {"job": job, "energy_joules": round(e.joules, 1), "mean_power_watts": r(e.mean_power_w, 1),
            "measured_seconds": round(e.seconds, 1), "steps": e.steps, "joules_per_step": r(e.joules_per_step, 3),
            "samples": e.samples, "joules_per_sample": r(e.joules_per_sample, 6)}


class EnergyTracker:
    """Joins each batch's energy counters with the jobs held (`jobs`, the rank store's snapshot) that this
    replica owns; a job that leaves the store has ended: its record is logged and kept for the API."""

    def __init__(self, jobs: Callable[[float], Jobs], *, owns: Callable[[str], bool] = lambda job: True) -> None:
        self._jobs = jobs
        self._owns = owns
        self._lock = threading.Lock()
        self._ledger = Ledger()
        self._ended: deque[dict[str, object]] = deque(maxlen=ENDED_KEPT)

    def observe(self, batch: TelemetryBatch) -> None:
        """Credit the batch's energy to the jobs on each board; report the jobs that ended since."""
        held = {j: r for j, r in self._jobs(batch.t).items() if self._owns(j)}
        with self._lock:
            ledger = advance(self._ledger, attribution.readings(batch.gpus), attribution.holders(held, batch.gpus),
                             attribution.progress(held))
            ended = [j for j in ledger.jobs if j not in held]
            for job in ended:
                line = record(job, ledger.jobs[job])
                self._ended.append(line)
                log.info("job ended: energy", extra=line)
            self._ledger = forget(ledger, ended) if ended else ledger

    def jobs(self) -> Mapping[str, JobEnergy]:
        """Every running job's energy so far."""
        return self._ledger.jobs

    def view(self) -> dict[str, list[dict[str, object]]]:
        """The jobs API's body: running jobs (by name), then the last ended ones (oldest first)."""
        with self._lock:
            running = [{**record(j, e), "state": "running"} for j, e in sorted(self._ledger.jobs.items())]
            return {"jobs": running + [{**r, "state": "ended"} for r in self._ended]}

    def series(self) -> list[Series]:
        """Per running job: energy, mean power, energy per step and per sample (values not yet known left out)."""
        out = []
        for job, e in sorted(self._ledger.jobs.items()):
            labels = (("job", job),)
            out.append(Series("gpumond_job_energy_joules_total", labels, e.joules))
            for name, v in (("gpumond_job_power_watts", e.mean_power_w),
                            ("gpumond_job_energy_per_step_joules", e.joules_per_step),
                            ("gpumond_job_energy_per_sample_joules", e.joules_per_sample)):
                if v is not None:
                    out.append(Series(name, labels, v))
        return out


__all__ = ["ENERGY_METRICS", "EnergyTracker", "record"]
