"""What GPM and NVLink telemetry add to a candidate's evidence: SM and tensor activity, and NVLink replays as a
named cause. Pure, and applied after the detectors: it explains a finding, it never makes or removes one.

A straggler or starved rank's GPU that shows high utilization but low SM activity is busy doing little; a node
whose GPUs replay on NVLink (the agent's GpuNvLinkErrorsIncreasing) slows every collective through them, which
is the straggler-node finding's likely cause. Values are present only where the agents export them (Hopper and
later for GPM); nothing is added otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from gpumond.rules.detectors.candidate import Candidate
from gpumond.rules.detectors.stats import median
from gpumond.rules.types import GpuSample

# Replays per second over the window, on all links of a GPU, that name NVLink as a cause (the agent alerts on
# one link from the same rate).
NVLINK_REPLAY_PER_S = 1.0
NVLINK_CAUSE = "nvlink_errors"
_PER_GPU = frozenset({"straggler", "io_starved_rank", "hung_rank"})


def _live(samples: Sequence[GpuSample], since: float) -> list[GpuSample]:
    return [s for s in samples if s.up and s.t >= since]


def activity(samples: Sequence[GpuSample], key: str) -> float | None:
    """The median of `key` (sm_active, tensor_active) over the samples that have it."""
    xs = [s.values[key] for s in samples if key in s.values]
    return median(xs) if xs else None


def replay_rate(samples: Sequence[GpuSample]) -> float | None:
    """NVLink replays per second from the first and last counter reading in the window (None: too few, or
    the counter went back, e.g. a reset)."""
    xs = [(s.t, s.values["nvlink_replays_total"]) for s in samples if "nvlink_replays_total" in s.values]
    if len(xs) < 2 or xs[-1][0] <= xs[0][0] or xs[-1][1] < xs[0][1]:
        return None
    return (xs[-1][1] - xs[0][1]) / (xs[-1][0] - xs[0][0])


def with_activity(c: Candidate, gpu_windows: Mapping[str, Sequence[GpuSample]], job_gpus: Mapping[str, str],
                  since: float) -> Candidate:
    """`c` with GPM activity and NVLink evidence added where telemetry has it; `job_gpus` is uuid → node of
    the job's reporting GPUs (the peers)."""
    windows = {u: _live(gpu_windows.get(u, ()), since) for u in job_gpus}
    evidence = dict(c.evidence)
    if c.kind in _PER_GPU and c.gpu_uuid in windows:
        mine = windows[c.gpu_uuid]
        for key in ("sm_active", "tensor_active"):
            value = activity(mine, key)
            peers = [v for u, w in windows.items() if u != c.gpu_uuid and (v := activity(w, key)) is not None]
            if value is not None:
                evidence[key] = round(value, 3)
                if peers:
                    evidence[f"peer_median_{key}"] = round(median(peers), 3)
        rate = replay_rate(mine)
        if rate is not None and rate >= NVLINK_REPLAY_PER_S:
            evidence["nvlink_replays_per_s"] = round(rate, 1)
            evidence.setdefault("likely_cause", NVLINK_CAUSE)
    elif c.kind == "straggler_node" and c.node is not None:
        rates = {u: r for u, node in job_gpus.items() if node == c.node
                 and (r := replay_rate(windows[u])) is not None and r >= NVLINK_REPLAY_PER_S}
        if rates:
            evidence["nvlink_replays_per_s"] = {u: round(r, 1) for u, r in sorted(rates.items())}
            evidence.setdefault("likely_cause", NVLINK_CAUSE)
    if evidence == c.evidence:
        return c
    return replace(c, evidence=evidence)
