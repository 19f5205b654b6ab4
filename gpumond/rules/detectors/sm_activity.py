"""Pure: SM activity (GPM) as a straggler signal for ranks whose job pushes no collective wait.

In a synchronous step the slow rank computes while its peers spin inside the step's collectives. NVML's
utilization reads ~100 % on all of them (a spinning NCCL kernel is a kernel), but GPM's SM activity — the
share of SM cycles with a warp resident — is high while a GPU computes and low while it spins (NCCL's
kernels occupy only the SMs of their channels). So the straggler's SM activity stands out high against its
peers' over the same interval.

Over one agent interval (1 s) the reading depends on where in the step the interval fell, and agents on
different nodes sample at different moments: compared across nodes, a 4 s step's phase moves a GPU's
reading far more than a 10 % slowdown does. The GPUs of one node are read in the same interval, so each
reading is taken relative to the median of its node's readings at that instant: the step's phase, the
job's kernel mix and a heavier pipeline stage (whole nodes in this codebase's node-aligned stages) move a
node's GPUs together and cancel. What is left is each GPU's own deviation, averaged over the window with
the highest and lowest `trim` of the instants cut off, so that a transient of a few seconds (one or two
readings) does not carry it. A whole node slowed together is invisible here (its median moves with it);
the other signals and the straggler-node rule still see it.

Present only where the agents export `sm_active` (Hopper and later): elsewhere nothing is returned and the
detectors judge on the other signals, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpumond.rules.detectors.features import trimmed_mean
from gpumond.rules.detectors.stats import median
from gpumond.rules.types import GpuSample

KEY = "sm_active"


def node_relative(gpu_windows: Mapping[str, Sequence[GpuSample]], node_of: Mapping[str, str], since: float,
                  min_gpus: int, min_instants: int, trim: float) -> dict[str, float]:
    """uuid → trimmed mean over the window of (its SM activity − its node's median at the same instant).

    `node_of` is uuid → node of the GPUs to judge (MIG devices are left out: slices of different sizes are
    no peers). An instant counts where at least `min_gpus` of a node's GPUs have a reading; a GPU needs
    `min_instants` such instants."""
    at: dict[tuple[str, float], dict[str, float]] = {}
    for uuid, node in node_of.items():
        if uuid.startswith("MIG-"):
            continue
        for s in gpu_windows.get(uuid, ()):
            if s.up and s.t >= since and (v := s.values.get(KEY)) is not None:
                at.setdefault((node, s.t), {})[uuid] = v
    deviations: dict[str, list[float]] = {}
    for readings in at.values():
        if len(readings) < min_gpus:
            continue
        med = median(list(readings.values()))
        for uuid, v in readings.items():
            deviations.setdefault(uuid, []).append(v - med)
    return {u: trimmed_mean(xs, trim) for u, xs in deviations.items() if len(xs) >= min_instants}
