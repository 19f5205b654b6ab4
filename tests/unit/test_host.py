"""Host evidence against a fake psutil module: CPU ratios, memory, and which disks count."""

from __future__ import annotations

from collections import namedtuple
from types import SimpleNamespace

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpumond.agent.host import DiskReadTotal, HostEvidence, is_whole_disk

LinuxTimes = namedtuple(
    "LinuxTimes",
    "user nice system idle iowait irq softirq steal guest guest_nice",
)
MacTimes = namedtuple("MacTimes", "user nice system idle")
Memory = namedtuple("Memory", "total available percent used free")
DiskIO = namedtuple("DiskIO", "read_count write_count read_bytes write_bytes")


def linux_times(user=0.0, system=0.0, idle=0.0, iowait=0.0, guest=0.0) -> LinuxTimes:
    return LinuxTimes(user, 0.0, system, idle, iowait, 0.0, 0.0, 0.0, guest, 0.0)


def disk(read_bytes: int) -> DiskIO:
    return DiskIO(0, 0, read_bytes, 0)


class FakePsutil:
    """The three psutil calls HostEvidence makes, fed from lists the test controls."""

    def __init__(self, times, disks=None, memory=Memory(64e9, 48e9, 25.0, 0, 0)) -> None:
        self.times = list(times)
        self.disks = {"nvme0n1": disk(1000)} if disks is None else disks
        self.memory = memory
        self.error: Exception | None = None

    def cpu_times(self):
        if self.error is not None:
            raise self.error
        return self.times.pop(0)

    def virtual_memory(self):
        return self.memory

    def disk_io_counters(self, perdisk: bool = False):
        assert perdisk
        return self.disks


def test_first_read_uses_counters_since_boot() -> None:
    fake = FakePsutil([linux_times(user=30, system=10, idle=50, iowait=10)])
    reading = HostEvidence(fake).read()
    assert reading.cpu_utilization_ratio == pytest.approx(0.4)
    assert reading.cpu_iowait_ratio == pytest.approx(0.1)


def test_later_reads_use_deltas() -> None:
    fake = FakePsutil(
        [
            linux_times(user=30, system=10, idle=50, iowait=10),
            linux_times(user=120, system=10, idle=60, iowait=10),  # +90 user, +10 idle
            linux_times(user=120, system=10, idle=110, iowait=60),  # +50 idle, +50 iowait
        ]
    )
    host = HostEvidence(fake)
    host.read()
    second = host.read()
    assert second.cpu_utilization_ratio == pytest.approx(0.9)
    assert second.cpu_iowait_ratio == pytest.approx(0.0)
    third = host.read()
    assert third.cpu_utilization_ratio == pytest.approx(0.0)
    assert third.cpu_iowait_ratio == pytest.approx(0.5)


def test_guest_time_is_not_counted_twice() -> None:
    # 40 s of guest time is already inside user; the total is 100, not 140.
    fake = FakePsutil([linux_times(user=50, idle=50, guest=40)])
    assert HostEvidence(fake).read().cpu_utilization_ratio == pytest.approx(0.5)


def test_platform_without_iowait_reports_none() -> None:
    fake = FakePsutil([MacTimes(user=20, nice=0, system=20, idle=60)])
    reading = HostEvidence(fake).read()
    assert reading.cpu_iowait_ratio is None
    assert reading.cpu_utilization_ratio == pytest.approx(0.4)


def test_no_tick_elapsed_keeps_previous_ratios() -> None:
    same = linux_times(user=30, system=10, idle=50, iowait=10)
    host = HostEvidence(FakePsutil([same, same]))
    first = host.read()
    second = host.read()
    assert (second.cpu_utilization_ratio, second.cpu_iowait_ratio) == (
        first.cpu_utilization_ratio,
        first.cpu_iowait_ratio,
    )


def test_all_zero_counters_give_none_not_nan() -> None:
    reading = HostEvidence(FakePsutil([linux_times()])).read()
    assert reading.cpu_utilization_ratio is None
    assert reading.cpu_iowait_ratio is None


counters = st.floats(min_value=0, max_value=1e9, allow_nan=False)


@given(st.lists(st.tuples(counters, counters, counters, counters), min_size=1, max_size=6))
def test_ratios_stay_in_unit_interval_even_when_counters_step_back(samples) -> None:
    times = [linux_times(user=u, system=s, idle=i, iowait=w) for u, s, i, w in samples]
    host = HostEvidence(FakePsutil(times))
    for _ in samples:
        reading = host.read()
        for ratio in (reading.cpu_utilization_ratio, reading.cpu_iowait_ratio):
            assert ratio is None or 0.0 <= ratio <= 1.0


def test_memory_used_is_total_minus_available() -> None:
    fake = FakePsutil([linux_times(idle=1)], memory=Memory(64e9, 48e9, 25.0, 1e9, 2e9))
    assert HostEvidence(fake).read().memory_used_bytes == 16e9


@pytest.mark.parametrize(
    "name",
    ["sda", "sdab", "vda", "xvdf", "hdb", "nvme0n1", "nvme12n3", "mmcblk0", "dasda",
     "rbd0", "nbd1", "sr0", "PhysicalDrive0", "disk0"],
)
def test_whole_disks_count(name: str) -> None:
    assert is_whole_disk(name)


@pytest.mark.parametrize(
    "name",
    ["sda1", "sdab12", "vda2", "xvda1", "hdb3", "dasda1", "nvme0n1p1", "nvme12n3p15",
     "mmcblk0p1", "mmcblk0boot0", "mmcblk0rpmb", "nbd0p1", "nvme0c0n1",
     "loop0", "loop12", "ram0", "zram0", "dm-0", "dm-12", "md0", "md127"],
)
def test_partitions_and_stacked_devices_do_not_count(name: str) -> None:
    assert not is_whole_disk(name)


def test_disk_reads_sum_whole_disks_only() -> None:
    disks = {
        "sda": disk(1_000),
        "sda1": disk(900),
        "nvme0n1": disk(20_000),
        "nvme0n1p1": disk(19_000),
        "dm-0": disk(19_000),
        "md0": disk(500),
        "loop3": disk(77),
        "zram0": disk(5),
    }
    reading = HostEvidence(FakePsutil([linux_times(idle=1)], disks=disks)).read()
    assert reading.disk_read_bytes_total == 21_000.0


@pytest.mark.parametrize("disks", [{}, {"loop0": disk(10), "zram0": disk(3)}])
def test_no_physical_disk_gives_none(disks) -> None:
    assert HostEvidence(FakePsutil([linux_times(idle=1)], disks=disks)).read().disk_read_bytes_total is None


def test_disk_total_accepts_none_from_psutil() -> None:
    assert DiskReadTotal().update(None) is None


def test_disk_total_does_not_drop_when_a_disk_is_detached() -> None:
    total = DiskReadTotal()
    assert total.update({"sda": disk(10), "sdb": disk(5)}) == 15.0
    assert total.update({"sda": disk(12)}) == 17.0  # sdb's 5 bytes stay counted
    assert total.update({"sda": disk(12), "sdb": disk(7)}) == 19.0  # same sdb, still counting


def test_reattached_disk_with_fresh_counter_keeps_total_rising() -> None:
    total = DiskReadTotal()
    assert total.update({"sda": disk(10), "sdb": disk(500)}) == 510.0
    assert total.update({"sda": disk(10)}) == 510.0
    assert total.update({"sda": disk(10), "sdb": disk(3)}) == 513.0  # 500 banked + 3 new


def test_transient_empty_reading_neither_resets_nor_double_counts() -> None:
    total = DiskReadTotal()
    total.update({"nvme0n1": disk(100)})
    assert total.update({}) is None
    assert total.update({"nvme0n1": disk(150)}) == 150.0


@given(st.lists(st.dictionaries(st.sampled_from(["sda", "sdb", "nvme0n1"]),
                                st.integers(0, 10**12)), max_size=8))
def test_disk_total_is_monotonic(readings) -> None:
    total, last = DiskReadTotal(), 0.0
    for counters in readings:
        value = total.update({name: disk(n) for name, n in counters.items()})
        if value is not None:
            assert value >= last
            last = value


@pytest.mark.parametrize("error", [psutil.AccessDenied(), OSError(2, "no /proc/stat"), RuntimeError("boom")])
def test_psutil_errors_propagate(error: Exception) -> None:
    fake = FakePsutil([linux_times(idle=1)])
    fake.error = error
    with pytest.raises(type(error)):
        HostEvidence(fake).read()


def test_failed_read_leaves_cpu_baseline_alone() -> None:
    fake = FakePsutil(
        [
            linux_times(user=50, idle=50),
            linux_times(user=150, idle=50),  # read fails after this sample
            linux_times(user=150, idle=150),
        ]
    )
    host = HostEvidence(fake)
    host.read()
    fake.disks = {"sda": object()}  # no read_bytes: this cycle's disk read fails
    with pytest.raises(AttributeError):
        host.read()
    fake.disks = {"sda": disk(1)}
    # Measured from the last good read: +100 user, +100 idle.
    assert host.read().cpu_utilization_ratio == pytest.approx(0.5)


def test_reads_through_fake_module_namespace() -> None:
    # Any object with psutil's three functions is accepted, not just the module.
    module = SimpleNamespace(
        cpu_times=lambda: linux_times(user=1, idle=3),
        virtual_memory=lambda: Memory(10, 4, 0, 0, 0),
        disk_io_counters=lambda perdisk: {"sda": disk(7)},
    )
    reading = HostEvidence(module).read()
    assert (reading.cpu_utilization_ratio, reading.memory_used_bytes, reading.disk_read_bytes_total) == (
        pytest.approx(0.25),
        6.0,
        7.0,
    )
