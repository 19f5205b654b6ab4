"""Pure: MIG devices as GPU samples of their own, carrying their parent GPU's board-wide telemetry.

A rank on a MIG slice pushes its MIG UUID. Temperature, power, clocks and throttle reasons exist only for
the whole board, so the MIG device's sample is its parent's values under the MIG UUID, with the profile
that decides which ranks are its peers. The agent's `gpumond_gpu_mig_info{uuid, mig_uuid, gpu_instance,
compute_instance, profile}` says which device belongs to which GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gpumond.rules.types import GpuSample
from gpumond.wire.identity import MIG_UUID


@dataclass(frozen=True, slots=True)
class MigRow:
    """One gpumond_gpu_mig_info series."""

    parent_uuid: str
    uuid: str
    gpu_instance: int
    compute_instance: int
    profile: str


def mig_row(labels: Mapping[str, str]) -> MigRow | None:
    """The MIG device a gpumond_gpu_mig_info series names, or None if its labels are unusable."""
    parent, uuid = labels.get("uuid", ""), labels.get("mig_uuid", "")
    gi, ci = labels.get("gpu_instance", ""), labels.get("compute_instance", "")
    if not (parent.startswith("GPU-") and MIG_UUID.fullmatch(uuid) and gi.isdecimal() and ci.isdecimal()):
        return None
    # The push API lower-cases a UUID's hex; so does the join, whatever case an agent or proxy used.
    return MigRow(parent, "MIG-" + uuid[4:].lower(), int(gi), int(ci), labels.get("profile", ""))


def mig_samples(parents: Iterable[GpuSample], rows: Iterable[MigRow],
                jobs: Mapping[str, Iterable[str]]) -> list[GpuSample]:
    """One sample per MIG device whose parent is among `parents` (same node, time, liveness and values)."""
    by_uuid = {p.uuid: p for p in parents}
    out = []
    for row in rows:
        parent = by_uuid.get(row.parent_uuid)
        if parent is None:
            continue
        out.append(replace(parent, uuid=row.uuid, jobs=tuple(sorted(set(jobs.get(row.uuid, ())))),
                           parent_uuid=parent.uuid, mig_profile=row.profile, gpu_instance=row.gpu_instance,
                           compute_instance=row.compute_instance))
    return out
