"""What a push says, as values: one step, who pushed it, and a push's steps as columns.

Shared by the rules service (which stores them) and the agent's relay (which checks what it forwards), so both
judge a push with the same code (gpumond/push/body.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One training step as a rank reported it."""

    step: int
    end: float  # unix seconds when the step ended
    duration_s: float  # wall time of the step
    data_wait_s: float  # time blocked waiting on the data loader within the step
    samples: int | None = None
    # Time this rank waited for its peers in the step's collectives (optional; SDKs before 0.2 omit it).
    # In synchronous training the slowest rank waits least: the one push signal that localises a straggler.
    comm_wait_s: float | None = None


@dataclass(frozen=True, slots=True)
class RankInfo:
    """Who a rank is: the job, its place in it, and the GPU it runs on (the join key is gpu_uuid)."""

    job: str
    rank: int
    world_size: int
    node: str
    gpu_uuid: str
    group: str | None = None  # peer group, e.g. a pipeline stage; ranks compare only within it


@dataclass(frozen=True, slots=True, eq=False)
class StepColumns:
    """A rank's steps as numpy arrays, oldest first, aligned 1:1 with RankWindow.steps.

    Why: detectors read millions of steps per evaluation; reading them from arrays the store keeps up to
    date on ingest costs a copy, reading them from StepRecord objects costs an attribute lookup each.
    `values` holds end, duration_s, data_wait_s and comm_wait_s as rows (NaN where a rank did not report
    comm_wait_s), so a job's ranks concatenate in one call. The arrays are read-only views of buffers
    their owner never writes again under them: snapshots share them across threads.
    """

    # eq=False: equal content is not identity, and numpy's elementwise == has no truth value.
    step: np.ndarray  # int64, (n,)
    values: np.ndarray  # float64, (4, n): end, duration_s, data_wait_s, comm_wait_s
    # int64, (n,): samples of each step, -1 where not reported. Only a decoded push carries it: the store
    # adds the new steps' samples to its rank's total and holds no row for them (8 B per held step saved).
    samples: np.ndarray | None = None

    FIELDS = ("end", "duration_s", "data_wait_s", "comm_wait_s")

    @property
    def end(self) -> np.ndarray:
        return self.values[0]

    @property
    def duration_s(self) -> np.ndarray:
        return self.values[1]

    @property
    def data_wait_s(self) -> np.ndarray:
        return self.values[2]

    @property
    def comm_wait_s(self) -> np.ndarray:
        return self.values[3]

    def __len__(self) -> int:
        return self.step.shape[0]
