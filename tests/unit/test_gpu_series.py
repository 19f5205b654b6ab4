from gpumond.agent.attribution import DeviceJob
from gpumond.agent.gpu_series import error_series, info_series, job_series, tier_series, xid_series
from gpumond.nvml.session import GpuIdentity, GpuRead, TierRead
from tests.unit.series_helpers import by_name, read_of

G0 = GpuIdentity(0, "GPU-aaa", "Sim H100", "00000000:18:00.0")
G1 = GpuIdentity(1, "GPU-bbb", "Sim H100", "00000000:2A:00.0")


def test_units_are_converted_to_base_units():
    read = TierRead(True, (GpuRead(G0, True, read_of(
        ("temperature", "gpu", 71.0), ("power", "watts", 412_345.0), ("sm_clock", "current", 1980.0),
        ("utilization", "gpu", 87.0), ("energy", "total", 5_000.0),
        ("fields_fast", "ev_hw_thermal", 2_500_000_000.0))),),)
    s = by_name(tier_series(read, with_up=True))
    assert s["gpumond_gpu_temperature_celsius"] == [({"gpu": "0", "uuid": "GPU-aaa"}, 71.0)]
    assert s["gpumond_gpu_power_watts"][0][1] == 412.345
    assert s["gpumond_gpu_sm_clock_hertz"][0][1] == 1.98e9
    assert s["gpumond_gpu_utilization_ratio"][0][1] == 0.87
    assert s["gpumond_gpu_energy_joules_total"][0][1] == 5.0
    assert s["gpumond_gpu_clocks_event_seconds_total"] == [
        ({"gpu": "0", "uuid": "GPU-aaa", "reason": "hw_thermal_slowdown"}, 2.5)]
    assert s["gpumond_gpu_up"] == [({"gpu": "0", "uuid": "GPU-aaa"}, 1.0)]
    assert s["gpumond_nvml_up"] == [({}, 1.0)]


def test_clock_event_mask_expands_to_one_series_per_reason():
    read = TierRead(True, (GpuRead(G0, True, read_of(("clocks_event", "mask", 0x4 | 0x40))),))
    active = {lab["reason"]: v for lab, v in by_name(tier_series(read, with_up=False))[
        "gpumond_gpu_clocks_event_active"]}
    assert active["sw_power_cap"] == 1.0 and active["hw_thermal_slowdown"] == 1.0
    assert active["gpu_idle"] == 0.0 and active["hw_slowdown"] == 0.0
    assert len(active) == 9


def test_clock_event_mask_is_also_exported_whole_as_one_bitmask_series():
    # The rules service asks this one series a GPU (not nine) between refreshes and decodes the same bits.
    read = TierRead(True, (GpuRead(G0, True, read_of(("clocks_event", "mask", 0x4 | 0x40 | 0x100))),))
    s = by_name(tier_series(read, with_up=False))
    assert s["gpumond_gpu_clocks_event_reasons_bitmask"] == [({"gpu": "0", "uuid": "GPU-aaa"}, 0x144)]


def test_a_lost_gpu_exports_up_zero_and_nothing_else_while_its_peer_is_untouched():
    read = TierRead(True, (GpuRead(G0, False, ()), GpuRead(G1, True, read_of(("temperature", "gpu", 60.0)))))
    s = by_name(tier_series(read, with_up=True))
    assert ({"gpu": "0", "uuid": "GPU-aaa"}, 0.0) in s["gpumond_gpu_up"]
    assert s["gpumond_gpu_temperature_celsius"] == [({"gpu": "1", "uuid": "GPU-bbb"}, 60.0)]


def test_values_not_read_are_absent_not_zero():
    read = TierRead(True, (GpuRead(G0, True, read_of(("temperature", "gpu", 60.0))),))
    s = by_name(tier_series(read, with_up=False))
    assert "gpumond_gpu_memory_temperature_celsius" not in s
    assert "gpumond_gpu_up" not in s  # only the fast tier speaks for up


def test_info_xid_error_and_job_series_carry_identity():
    idents = {0: G0, 1: G1}
    info = info_series([G0], "node-a")
    assert dict(info[0].labels) == {"gpu": "0", "uuid": "GPU-aaa", "name": "Sim H100",
                                    "pci_bus_id": "00000000:18:00.0", "hostname": "node-a"}
    xid = xid_series({(1, 79): 1, (0, 48): 2, (7, 13): 1}, idents)  # gpu 7 unknown: dropped
    assert [(dict(s.labels)["gpu"], dict(s.labels)["xid"], s.value) for s in xid] == [("0", "48", 2.0),
                                                                                      ("1", "79", 1.0)]
    err = error_series({(0, "nvmlDeviceGetPowerUsage", "unknown"): 3}, idents)
    assert dict(err[0].labels)["error"] == "unknown" and err[0].value == 3.0
    jobs = job_series({"GPU-aaa": (DeviceJob("123"), DeviceJob("k8s-pod/abc")), "GPU-bbb": ()}, idents)
    assert sorted(dict(s.labels)["job"] for s in jobs) == ["123", "k8s-pod/abc"]
    # the per-GPU label set is the contract: gpu, uuid, job (pod labels only when the kubelet named one)
    assert {tuple(k for k, _ in s.labels) for s in jobs} == {("gpu", "uuid", "job")}


def test_a_per_link_key_is_exported_with_its_link_label_and_gpm_percent_as_a_ratio():
    read = TierRead(True, (GpuRead(G0, True, read_of(
        ("nvlink_state", "up@0", 1.0), ("nvlink_state", "up@17", 0.0), ("nvlink_state", "bogus@3", 1.0),
        ("nvlink_errors", "replay@2", 9.0), ("nvlink_errors", "replay_total", 9.0),
        ("gpm", "sm", 81.0), ("gpm", "pcie_rx", 2.0))),),)
    s = by_name(tier_series(read, with_up=False))
    assert s["gpumond_gpu_nvlink_up"] == [({"gpu": "0", "uuid": "GPU-aaa", "link": "0"}, 1.0),
                                          ({"gpu": "0", "uuid": "GPU-aaa", "link": "17"}, 0.0)]
    # Counters are exported per GPU (the per-link value is read for the agent's alerts, not exported).
    assert s["gpumond_gpu_nvlink_errors_total"] == [({"gpu": "0", "uuid": "GPU-aaa", "type": "replay"}, 9.0)]
    assert s["gpumond_gpu_sm_active_ratio"][0][1] == 0.81
    assert s["gpumond_gpu_pcie_bytes_per_second"] == [
        ({"gpu": "0", "uuid": "GPU-aaa", "direction": "rx"}, 2 * 1048576.0)]
    assert not any("bogus" in name for name in s)
