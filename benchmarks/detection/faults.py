"""Planted faults: what is wrong, where, from when, for how long. The ground truth the scorer matches against."""

from __future__ import annotations

from dataclasses import dataclass

# Fault kinds and the finding class that should report each.
TRUTH_CLASS = {
    "slow_gpu": "straggler",
    "slow_node": "straggler_node",
    "starved_rank": "starved_rank",
    "starved_node": "starved_rank",  # expanded into one starved_rank truth per rank of the node
    "starved_job": "starved_job",
    # One rank's loader far slower while the whole job's waits a little: the rank must be named; an
    # io_starved_job beside it is neither right nor wrong (whether the others still wait enough depends on
    # how much the outlier lengthens everyone's step).
    "starved_outlier": "starved_rank",
    "hung_rank": "hung",
    "starved_sub": "none",  # a rank waiting < 5 %: must not be reported
}
THROTTLE_REASONS = ("hw_thermal", "hw_slowdown", "hw_power_brake")


@dataclass(frozen=True, slots=True)
class Fault:
    """One planted fault. `rank`/`node` say where; only the fields of its kind matter."""

    kind: str
    job: str
    onset: float  # unix s
    duration: float  # s
    rank: int | None = None  # slow_gpu, starved_rank, hung_rank, starved_sub
    node: str | None = None  # slow_node, starved_node (and the rank's node for rank faults)
    gpu_uuid: str | None = None
    slowdown: float = 1.0  # slow_gpu, slow_node: compute time multiplier
    visible: bool = False  # slow_*: throttled with clock down and a reason bit, else silent
    reason: str | None = None  # the throttle reason when visible
    wait_frac: float = 0.0  # starved_*: data-wait fraction of the step
    base_wait: float = 0.0  # starved_outlier: every other rank's loader waits this fraction of its own step
    cause: str | None = None  # starved_*: "cpu", "storage" or "remote" (host evidence shows the first two)
    level: str = ""  # the row label in result tables, e.g. "1.10 silent" or "20%"

    @property
    def end(self) -> float:
        """When the fault clears."""
        return self.onset + self.duration

    @property
    def truth(self) -> str:
        """The finding class that should report it."""
        return TRUTH_CLASS[self.kind]

    def active(self, t: float) -> bool:
        """Whether the fault is present at time t."""
        return self.onset <= t < self.end
