"""What the relay fills in of a rank's push: the node, the GPU its process runs on, the job the agent attributes that
GPU to. What the rank states wins; where the agent knows otherwise, the conflict is counted and logged once."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpumond.agent.relay.processes import ProcessDevices
from gpumond.wire.media import PID_HEADER

log = logging.getLogger("gpumond.agent.relay")

FIELDS = ("job", "node", "gpu_uuid")


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a relayed push is from, complete: what the rank stated, else what the agent found."""

    job: str
    node: str
    gpu_uuid: str


class FillError(ValueError):
    """A field the rank left out that the agent cannot find either; the message says what to set."""


class Filler:
    """Completes a push's identity from the agent's own knowledge; counts conflicts by field."""

    def __init__(self, node: str, devices: ProcessDevices,
                 jobs_of: Callable[[Iterable[int]], tuple[str, ...]] | None = None) -> None:
        self._node = node
        self._devices = devices
        self._jobs_of = jobs_of  # host PIDs → their job ids (the agent's attribution); None: attribution is off
        self._lock = threading.Lock()
        self.conflicts: Counter[str] = Counter()
        self._logged: set[str] = set()

    def fill(self, *, job: str | None, node: str | None, gpu_uuid: str | None, pid: int | None,
             pid_start: int | None = None) -> Identity:
        """The push's identity; FillError when a field is missing and cannot be found. `pid_start`: the sender's
        start time (clock ticks since boot), when it says it."""
        found = self._devices.device_of(pid, pid_start) if pid is not None else None
        found_uuid, host_pid = found if found is not None else (None, None)
        found_job = None
        if self._jobs_of is not None and host_pid is not None:
            jobs = self._jobs_of((host_pid,))
            found_job = jobs[0] if len(jobs) == 1 else None
        self._check("node", node, self._node)
        self._check("gpu_uuid", gpu_uuid, found_uuid)
        self._check("job", job, found_job)
        uuid = gpu_uuid or found_uuid
        if uuid is None:
            where = (f"no GPU of this node runs pid {pid} (NVML's compute processes)" if pid is not None else
                     f"the push's sender did not say its process id ({PID_HEADER} header)")
            raise FillError(f"gpu_uuid: not given and {where}: set GPUMOND_GPU_UUID for this rank")
        chosen_job = job or found_job
        if chosen_job is None:
            raise FillError("job: not given and the agent attributes no single job to this rank's process: set "
                            "GPUMOND_JOB_ID")
        return Identity(chosen_job, node or self._node, uuid)

    def _check(self, field: str, stated: str | None, known: str | None) -> None:
        if stated is None or known is None or stated == known:
            return
        if field == "gpu_uuid" and stated.lower() == known.lower():
            return
        with self._lock:
            self.conflicts[field] += 1
            first = field not in self._logged
            self._logged.add(field)
        if first:
            log.warning("a rank states another %s than the agent finds; the rank's wins (further conflicts are "
                        "counted in gpumond_relay_conflicts_total)", field,
                        extra={"field": field, "stated": stated, "found": known})
