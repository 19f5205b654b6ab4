"""Which GPU or MIG device a rank's process runs on, from NVML's compute processes, whatever PID namespace the rank
sees itself in.

NVML lists host PIDs (the agent runs in the host's PID namespace: hostPID in the chart, or on the host). A rank in a
container knows only its own PID there, which is the last entry of its process's `NSpid:` line in
/proc/<host pid>/status. So every listed process is keyed by each PID it has in the nested namespaces; a PID that
names processes on different devices (PID 1 in two containers, say) fills nothing: the relay never guesses a GPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

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


class ProcessDevices:
    """PID (host or namespaced) → (device UUID, host PID), refreshed from NVML on a miss at most every REFRESH_S."""

    def __init__(self, read: Callable[[], Mapping[str, Iterable[int]]], clock: Callable[[], float],
                 namespaced: Callable[[int], tuple[int, ...]] = nspids) -> None:
        self._read = read  # device UUID → host PIDs of its compute processes; MIG devices as their own UUIDs
        self._clock = clock
        self._namespaced = namespaced
        self._lock = threading.Lock()
        self._map: dict[int, tuple[str, int] | None] = {}
        self._read_at = float("-inf")

    def due(self, pid: int) -> bool:
        """Whether finding `pid` reads NVML (which can wait: the caller may `refresh` on a thread of its own first)."""
        with self._lock:
            return self._due(pid)

    def refresh(self) -> None:
        """Read NVML's compute processes now (and each process's namespaced PIDs)."""
        found = self._build()  # outside the lock: a lookup meanwhile uses the previous map
        with self._lock:
            self._map, self._read_at = found, self._clock()

    def device_of(self, pid: int) -> tuple[str, int] | None:
        """(device UUID, host PID) of the process the rank calls `pid`; None when unknown or ambiguous."""
        with self._lock:
            if self._due(pid):
                self._map, self._read_at = self._build(), self._clock()
            return self._map.get(pid)

    def _due(self, pid: int) -> bool:
        age = self._clock() - self._read_at
        return age >= MAX_AGE_S or (pid not in self._map and age >= REFRESH_S)

    def _build(self) -> dict[int, tuple[str, int] | None]:
        found: dict[int, set[tuple[str, int]]] = {}
        devices = self._read()
        # A MIG device names where the process runs more precisely than its parent GPU (which lists every
        # instance's processes too): a host PID seen on a MIG device is taken from there only.
        on_mig = {p for uuid, pids in devices.items() if uuid.startswith("MIG-") for p in pids}
        for uuid, pids in devices.items():
            for host_pid in pids:
                if host_pid in on_mig and not uuid.startswith("MIG-"):
                    continue
                for pid in {host_pid, *self._namespaced(host_pid)}:
                    found.setdefault(pid, set()).add((uuid, host_pid))
        return {pid: next(iter(where)) if len(where) == 1 else None for pid, where in found.items()}
