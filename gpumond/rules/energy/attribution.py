"""Pure: which jobs hold which GPU board, and in what share, from the ranks the rules service holds and one
telemetry batch; and each board's energy counter in that batch.

A rank names the GPU it runs on (`gpu_uuid`, a MIG device's UUID on a MIG slice). A MIG device has no
energy counter of its own: NVML counts the whole board. A job on MIG slices is charged the board's energy in
proportion to its slices' compute slices (the `3` of a `3g.40gb` profile) against those of every MIG device
the board has configured; the share of a device no job uses is nobody's. Two jobs on one whole GPU (MPS,
time slicing) split it evenly: NVML cannot tell their power apart.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from gpumond.rules.energy.ledger import Progress, Reading, Shares
from gpumond.rules.types import GpuSample, RankWindow

_SLICES = re.compile(r"(\d+)g\.")
ENERGY = "energy_j"


def readings(samples: Iterable[GpuSample]) -> list[Reading]:
    """Each whole board's counter in the batch: live, not a MIG device (it repeats its parent's), with energy."""
    return [Reading(s.uuid, s.t, float(s.values[ENERGY])) for s in samples
            if s.up and s.parent_uuid is None and ENERGY in s.values]


def compute_slices(profile: str | None) -> int:
    """The compute slices of a MIG profile (`3g.40gb` → 3); 1 when the name does not say."""
    m = _SLICES.match(profile or "")
    return max(1, int(m.group(1))) if m else 1


def holders(jobs: Mapping[str, Mapping[int, RankWindow]], samples: Iterable[GpuSample]) -> dict[str, Shares]:
    """Board uuid → ((job, share), …): each board's jobs and their shares of its energy."""
    migs = {s.uuid: s for s in samples if s.parent_uuid is not None}
    board_slices: dict[str, int] = {}
    for s in migs.values():
        board_slices[s.parent_uuid] = board_slices.get(s.parent_uuid, 0) + compute_slices(s.mig_profile)
    # device uuid → jobs on it (a device used by two ranks of one job is held once)
    on_device: dict[str, set[str]] = {}
    for job, ranks in jobs.items():
        for w in ranks.values():
            on_device.setdefault(w.info.gpu_uuid, set()).add(job)
    out: dict[str, dict[str, float]] = {}
    for device, names in on_device.items():
        mig = migs.get(device)
        if mig is None:
            board, share = device, 1.0
        else:
            board = mig.parent_uuid  # type: ignore[assignment]
            share = compute_slices(mig.mig_profile) / board_slices[board]
        per_job = out.setdefault(board, {})
        for job in names:
            per_job[job] = per_job.get(job, 0.0) + share / len(names)
    return {board: tuple(sorted(shares.items())) for board, shares in out.items()}


def progress(jobs: Mapping[str, Mapping[int, RankWindow]]) -> dict[str, Progress]:
    """Each job's highest step number among its ranks' held steps, and the samples its ranks reported in
    total (each rank's `samples=`: its own share of the step), jobs with no step held left out."""
    out: dict[str, Progress] = {}
    for job, ranks in jobs.items():
        last = [_last_step(w) for w in ranks.values()]
        known = [s for s in last if s is not None]
        if known:
            out[job] = Progress(max(known), sum(w.samples for w in ranks.values()))
    return out


def _last_step(w: RankWindow) -> int | None:
    if w.columns is not None:
        return int(w.columns.step[-1]) if len(w.columns) else None
    return w.steps[-1].step if w.steps else None
