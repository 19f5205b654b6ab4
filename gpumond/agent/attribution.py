"""Pure: which jobs (and pods) run on each GPU or MIG device, from its processes and the kubelet.

The chain, first answer wins for a device:
1. the job id in a process's environment (GPUMOND_JOB_ID, SLURM_JOB_ID, TORCHELASTIC_RUN_ID): what
   the job SDK pushes, so the rules service can join on it; it keeps its pod labels when the kubelet
   names the device's pod;
2. the pod the kubelet's pod-resources API assigned the device to (job `k8s-pod/<namespace>/<pod>`),
   which needs neither hostPID nor readable processes;
3. the pod UID in a process's cgroup (job `k8s-pod/<uid>`), when pod-resources is off or unusable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gpumond.agent.podresources.assign import PodRef
from gpumond.nvml.mig import MigIdentity
from gpumond.nvml.session import GpuIdentity


class JobLookup(Protocol):
    """JobAttributor's lookup: job ids of host PIDs (env first, then the pod cgroup when `pods`)."""

    def jobs_for(self, pids: Iterable[int], pods: bool = True) -> tuple[str, ...]: ...


@dataclass(frozen=True, slots=True, order=True)
class DeviceJob:
    """One job on one device, with the pod's container when the kubelet named it."""

    job: str
    pod: PodRef | None = None


def attribute(devices: Iterable[tuple[str, tuple[int, ...]]], jobs: JobLookup,
              pods: Mapping[str, tuple[PodRef, ...]] | None) -> dict[str, tuple[DeviceJob, ...]]:
    """UUID → its jobs, for devices given as (uuid, host PIDs); `pods` None means pod-resources is unusable."""
    out: dict[str, tuple[DeviceJob, ...]] = {}
    for uuid, pids in devices:
        held = pods.get(uuid, ()) if pods is not None else ()
        if not held:
            rows = [DeviceJob(j) for j in jobs.jobs_for(pids)]
        else:
            named = jobs.jobs_for(pids, pods=False)
            if len(held) == 1:
                rows = [DeviceJob(j, held[0]) for j in named] or [DeviceJob(held[0].job, held[0])]
            else:
                # Time-sliced: several pods share the device and a process cannot be matched to its pod
                # here, so each pod is its own row and environment job ids stand without pod labels.
                rows = [DeviceJob(p.job, p) for p in held] + [DeviceJob(j) for j in named]
        if rows:
            out[uuid] = tuple(sorted(set(rows), key=lambda r: (r.job, r.pod or PodRef("", "", ""))))
    return out


def describe(row: DeviceJob, mig: MigIdentity | None = None) -> str:
    """One line for an operator: the job, its pod and container, and the MIG slice it runs on."""
    text = f"job {row.job}"
    if row.pod is not None:
        text += f" (pod {row.pod.namespace}/{row.pod.pod}, container {row.pod.container})"
    if mig is not None:
        text += f" on MIG {mig.profile or 'slice'} {mig.uuid}"
    return text


def workloads(found: Mapping[str, tuple[DeviceJob, ...]], gpus: Iterable[GpuIdentity],
              migs: Iterable[MigIdentity]) -> dict[str, tuple[str, ...]]:
    """GPU UUID → what runs on it and on its MIG devices (a board alert concerns every slice)."""
    out: dict[str, list[str]] = {g.uuid: [describe(r) for r in found.get(g.uuid, ())] for g in gpus}
    for m in migs:
        out.setdefault(m.parent_uuid, []).extend(describe(r, m) for r in found.get(m.uuid, ()))
    return {uuid: tuple(dict.fromkeys(lines)) for uuid, lines in out.items() if lines}
