"""Host evidence: CPU, iowait, memory and disk reads, to tell CPU starvation from storage starvation."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import psutil

from gpumond.agent.readings import HostReading

# Linux already counts guest time inside user and nice (as psutil's own cpu_percent
# assumes); adding it again would inflate the total.
_GUEST_FIELDS = frozenset({"guest", "guest_nice"})

# Devices whose reads are also counted on the physical disks beneath them
# (device-mapper: LVM, dm-crypt, multipath; md software RAID), or that hold no disk
# at all (loop files, RAM disks, compressed swap in RAM).
_STACKED_OR_VIRTUAL = re.compile(r"^(?:loop|ram|zram|dm-|md)")
# Partitions, whose reads the kernel also counts on their whole disk: a digit suffix on
# letter-named disks (sda1, vdb2, xvda1, dasda1), "p<n>" on digit-named ones
# (nvme0n1p1, mmcblk0p1, nbd0p1), plus eMMC hardware partitions and the per-path nodes
# of a multipath NVMe namespace, which its nvmeXnY head already sums.
_PARTITION = re.compile(
    r"^(?:(?:sd|hd|vd|xvd|dasd)[a-z]+\d+"
    r"|.*\dp\d+"
    r"|mmcblk\d+(?:boot\d+|rpmb)"
    r"|nvme\d+c\d+n\d+)$"
)


def is_whole_disk(name: str) -> bool:
    """Return True if a psutil per-disk name is a whole physical disk worth counting."""
    return not (_STACKED_OR_VIRTUAL.match(name) or _PARTITION.match(name))


class DiskReadTotal:
    """Bytes read from whole physical disks, kept monotonic while disks come and go.

    A plain sum of per-disk counters drops when a disk is detached, and Prometheus
    `rate()` would read that drop as a reset and count the remaining disks' whole
    history as new reads. So a detached disk keeps contributing its last count, and a
    re-attached one (its counter restarted) banks the old count first. Restarting the
    agent still starts over from the present disks' since-boot sum: a rare, real
    counter reset that `rate()` handles. psutil already unwraps 32-bit kernel counters.
    Reads from network filesystems (NFS, Lustre, object stores) never touch a local
    block device and are not in this number.
    """

    def __init__(self) -> None:
        self._last: dict[str, int] = {}  # per disk, kept after it disappears
        self._banked = 0  # counts of disks whose counter restarted from zero

    def update(self, counters: Mapping[str, Any] | None) -> float | None:
        """Fold in psutil's per-disk counters; None if they hold no whole physical disk."""
        current = {n: io.read_bytes for n, io in (counters or {}).items() if is_whole_disk(n)}
        if not current:
            return None
        for name, value in current.items():
            previous = self._last.get(name)
            if previous is not None and value < previous:
                self._banked += previous
            self._last[name] = value
        return float(self._banked + sum(self._last.values()))


def _clamp_ratio(value: float) -> float:
    return min(max(value, 0.0), 1.0)


class HostEvidence:
    """Reads host CPU, iowait, memory and disk-read evidence through psutil.

    CPU ratios are over the interval since the previous `read()` (since boot on the
    first). Meant for one sampler; psutil errors propagate so the caller's per-source
    wrapper reports the failure.
    """

    def __init__(self, psutil_module: Any = psutil) -> None:
        self._psutil = psutil_module
        self._disk_reads = DiskReadTotal()
        self._previous_times: dict[str, float] = {}
        self._previous_ratios: tuple[float | None, float | None] = (None, None)

    def read(self) -> HostReading:
        """Return one host reading."""
        times = self._psutil.cpu_times()._asdict()
        memory = self._psutil.virtual_memory()
        memory_used = float(memory.total - memory.available)
        disks = self._psutil.disk_io_counters(perdisk=True)
        # Baselines move only once every psutil call has succeeded.
        disk_read = self._disk_reads.update(disks)
        cpu, iowait = self._cpu_ratios(times)
        return HostReading(
            cpu_utilization_ratio=cpu,
            cpu_iowait_ratio=iowait,
            memory_used_bytes=memory_used,
            disk_read_bytes_total=disk_read,
        )

    def _cpu_ratios(self, times: dict[str, float]) -> tuple[float | None, float | None]:
        # Clamp per field: counters can step back when a CPU goes offline.
        delta = {k: max(v - self._previous_times.get(k, 0.0), 0.0) for k, v in times.items()}
        self._previous_times = times
        total = sum(v for k, v in delta.items() if k not in _GUEST_FIELDS)
        if total <= 0:
            # No clock tick since the last read: nothing new was measured.
            return self._previous_ratios
        has_iowait = "iowait" in delta  # Linux only; elsewhere the platform has no such state
        iowait = delta.get("iowait", 0.0)
        cpu = _clamp_ratio(1.0 - (delta["idle"] + iowait) / total)
        ratios = (cpu, _clamp_ratio(iowait / total) if has_iowait else None)
        self._previous_ratios = ratios
        return ratios
