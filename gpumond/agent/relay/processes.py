"""Which GPU or MIG device a rank's process runs on, from NVML's compute processes, whatever PID namespace the rank
sees itself in.

NVML lists host PIDs (the agent runs in the host's PID namespace: hostPID in the chart, or on the host). A rank in a
container knows only its own PID there, which is the last entry of its process's `NSpid:` line in
/proc/<host pid>/status. So every listed process is keyed by each PID it has in the nested namespaces. A PID alone
can name processes in other containers (pod A's pid 25 on a GPU, pod B's pid 25 not yet on one; PID 1 everywhere):
a rank that also says its start time (gpumond/wire/procstat.py, the same in every namespace) is matched on both; a
PID or (PID, start time) that names processes on different devices, or none, fills nothing: the relay never guesses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from gpumond.wire.procstat import start_ticks

# A rank that starts uses its GPU within seconds; asking NVML again on a miss at most this often bounds what a
# stream of pushes from processes NVML does not list (a CPU-only rank) can cost.
REFRESH_S = 5.0
# A hit is trusted this long: a PID reused by another process on another GPU is seen after at most this.
MAX_AGE_S = 60.0


def nspids(pid: int, proc: Path = Path("/proc")) -> tuple[int, ...]:
    """The PIDs of host process `pid` in each PID namespace it is nested in, outermost first; (pid,) when the kernel
    does not say (no NSpid line before Linux 4.1, or the process is gone)."""
    try:
        with open(proc / str(pid) / "status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    found = tuple(int(p) for p in line.split()[1:] if p.isdecimal())
                    return found or (pid,)
    except OSError:
        pass
    return (pid,)


# Where one listed process runs: (device UUID, host PID, start time in clock ticks since boot or None if unknown).
_Place = tuple[str, int, int | None]


class ProcessDevices:
    """PID (host or namespaced), and the start time where the rank says it → (device UUID, host PID), refreshed from
    NVML on a miss at most every REFRESH_S."""

    def __init__(self, read: Callable[[], Mapping[str, Iterable[int]]], clock: Callable[[], float],
                 namespaced: Callable[[int], tuple[int, ...]] = nspids,
                 started: Callable[[int], int | None] = start_ticks) -> None:
        self._read = read  # device UUID → host PIDs of its compute processes; MIG devices as their own UUIDs
        self._clock = clock
        self._namespaced = namespaced
        self._started = started  # host PID → its start time (clock ticks since boot), None when unknown
        self._lock = threading.Lock()
        self._map: dict[int, frozenset[_Place]] = {}
        self._read_at = float("-inf")

    def due(self, pid: int, start: int | None = None) -> bool:
        """Whether finding `pid` reads NVML (which can wait: the caller may `refresh` on a thread of its own first)."""
        with self._lock:
            return self._due(pid, start)

    def refresh(self) -> None:
        """Read NVML's compute processes now (and each process's namespaced PIDs and start time)."""
        found = self._build()  # outside the lock: a lookup meanwhile uses the previous map
        with self._lock:
            self._map, self._read_at = found, self._clock()

    def device_of(self, pid: int, start: int | None = None) -> tuple[str, int] | None:
        """(device UUID, host PID) of the process the rank calls `pid` and, when given, that started at `start`
        (clock ticks since boot); None when unknown or ambiguous."""
        with self._lock:
            if self._due(pid, start):
                self._map, self._read_at = self._build(), self._clock()
            where = {(uuid, host_pid) for uuid, host_pid, _ in self._matches(pid, start)}
            return next(iter(where)) if len(where) == 1 else None

    def _matches(self, pid: int, start: int | None) -> list[_Place]:
        places = self._map.get(pid, frozenset())
        # A rank that says its start time is that process only: an unknown start time is no match (never a guess).
        return [p for p in places if start is None or p[2] == start]

    def _due(self, pid: int, start: int | None) -> bool:
        age = self._clock() - self._read_at
        return age >= MAX_AGE_S or (not self._matches(pid, start) and age >= REFRESH_S)

    def _build(self) -> dict[int, frozenset[_Place]]:
        found: dict[int, set[_Place]] = {}
        devices = self._read()
        # A MIG device names where the process runs more precisely than its parent GPU (which lists every
        # instance's processes too): a host PID seen on a MIG device is taken from there only.
        on_mig = {p for uuid, pids in devices.items() if uuid.startswith("MIG-") for p in pids}
        for uuid, pids in devices.items():
            for host_pid in pids:
                if host_pid in on_mig and not uuid.startswith("MIG-"):
                    continue
                place = (uuid, host_pid, self._started(host_pid))
                for pid in {host_pid, *self._namespaced(host_pid)}:
                    found.setdefault(pid, set()).add(place)
        return {pid: frozenset(places) for pid, places in found.items()}
