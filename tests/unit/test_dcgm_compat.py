"""The dcgm-exporter-compatible series: names, units and labels as dcgm-exporter's default counters have them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpumond.agent.dcgm import DCGM_CATALOGUE, DcgmCompat, dcgm_labels, dcgm_types
from gpumond.agent.podresources.assign import PodRef
from gpumond.config import AgentConfig
from gpumond.config.errors import validation_problem
from gpumond.nvml.mig import MigIdentity
from gpumond.nvml.session import GpuIdentity, GpuRead, TierRead
from tests.unit.series_helpers import by_name, read_of

G0 = GpuIdentity(0, "GPU-aaa", "NVIDIA H100 80GB HBM3", "00000000:18:00.0", minor=2)
G1 = GpuIdentity(1, "GPU-bbb", "NVIDIA H100 80GB HBM3", "00000000:2A:00.0")

# dcgm-exporter's default-counters.csv (etc/default-counters.csv in NVIDIA/dcgm-exporter): the fields NVML can give.
DCGM_DEFAULT_NVML_FIELDS = {
    "DCGM_FI_DEV_SM_CLOCK": "gauge", "DCGM_FI_DEV_MEM_CLOCK": "gauge",
    "DCGM_FI_DEV_GPU_TEMP": "gauge", "DCGM_FI_DEV_MEMORY_TEMP": "gauge",
    "DCGM_FI_DEV_POWER_USAGE": "gauge", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter",
    "DCGM_FI_DEV_GPU_UTIL": "gauge", "DCGM_FI_DEV_MEM_COPY_UTIL": "gauge",
    "DCGM_FI_DEV_ENC_UTIL": "gauge", "DCGM_FI_DEV_DEC_UTIL": "gauge",
    "DCGM_FI_DEV_FB_FREE": "gauge", "DCGM_FI_DEV_FB_USED": "gauge", "DCGM_FI_DEV_FB_RESERVED": "gauge",
    "DCGM_FI_DEV_XID_ERRORS": "gauge", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "counter",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "counter", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
}
# Its profiling (DCP) fields, in default-counters.csv and dcp-metrics-included.csv: from NVML's GPM on Hopper and
# later; and the NVLink error totals of dcp-metrics-included.csv.
DCGM_PROF_AND_NVLINK_FIELDS = {
    **dict.fromkeys(["DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY",
                     "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
                     "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES",
                     "DCGM_FI_PROF_PCIE_RX_BYTES", "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES"],
                    "gauge"),
    **dict.fromkeys(["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                     "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"],
                    "counter"),
}


# DCGM's per-link NVLink error fields (dcgm_fields.h: _L0 … _L17, ids 400-493), with exposition.nvlink_per_link.
DCGM_PER_LINK_FIELDS = {f"DCGM_FI_DEV_NVLINK_{kind}_ERROR_COUNT_L{link}": "counter"
                        for kind in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY") for link in range(18)}


def test_names_and_types_are_dcgm_exporters() -> None:
    assert {k: v[0] for k, v in dcgm_types().items()} == (DCGM_DEFAULT_NVML_FIELDS | DCGM_PROF_AND_NVLINK_FIELDS
                                                           | DCGM_PER_LINK_FIELDS)


def test_per_link_error_fields_only_with_the_switch_and_under_each_links_own_name() -> None:
    read = TierRead(True, (GpuRead(G0, True, read_of(
        ("nvlink_errors", "replay_total", 30.0), ("nvlink_errors", "replay@0", 0.0),
        ("nvlink_errors", "replay@17", 30.0), ("nvlink_errors", "crc_data@3", 2.0),
        ("nvlink_throughput", "tx@3", 5.0))),),)
    off = by_name(DcgmCompat(hostname="n").tier_series(read, None))
    assert set(off) == {"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"}
    on = {k: v for k, ((_, v),) in by_name(DcgmCompat(hostname="n", per_link=True).tier_series(read, None)).items()}
    assert on == {"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 30.0, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0": 0.0,
                  "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L17": 30.0, "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L3": 2.0}
    # no `link` label: dcgm-exporter names a per-link field by its name alone
    assert all("link" not in labels for _, ((labels, _),) in
               by_name(DcgmCompat(hostname="n", per_link=True).tier_series(read, None)).items())


M_3G = MigIdentity(0, G0.uuid, "MIG-aaa", 1, 0, "3g.40gb")
M_3G_CI2 = MigIdentity(0, G0.uuid, "MIG-aab", 1, 1, "3g.40gb")  # a second compute instance in GPU instance 1
M_1G = MigIdentity(0, G0.uuid, "MIG-bbb", 5, 0, "1g.10gb")


def test_each_gpu_instance_gets_its_prof_fields_with_gpu_i_labels_and_its_pods() -> None:
    dcgm = DcgmCompat(hostname="n1")
    dcgm.set_pods({"MIG-bbb": (PodRef("ml", "trainer-0", "main"),)})
    activity = {"MIG-aaa": {"sm": 81.0, "tensor_any": 40.0, "pcie_tx": 3.0, "graphics": 90.0},
                "MIG-aab": {"sm": 81.0, "tensor_any": 40.0, "pcie_tx": 3.0, "graphics": 90.0},
                "MIG-bbb": {"sm": 0.0, "dram": 5.0}}
    s = by_name(dcgm.mig_series([M_3G, M_3G_CI2, M_1G], activity, {0: G0}, "570.1"))
    # the activity ratios only: PCIe bytes belong to the board
    assert set(s) == {"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                      "DCGM_FI_PROF_DRAM_ACTIVE"}
    sm = {labels["GPU_I_ID"]: (labels, v) for labels, v in s["DCGM_FI_PROF_SM_ACTIVE"]}
    assert len(s["DCGM_FI_PROF_SM_ACTIVE"]) == 2  # one per GPU instance, not per compute instance
    labels, value = sm["1"]
    assert value == 0.81 and labels == {
        "gpu": "0", "UUID": G0.uuid, "pci_bus_id": G0.pci_bus_id, "device": "nvidia2", "modelName": G0.name,
        "Hostname": "n1", "DCGM_FI_DRIVER_VERSION": "570.1", "GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": "1"}
    labels, value = sm["5"]
    assert value == 0.0 and labels["GPU_I_PROFILE"] == "1g.10gb"
    assert (labels["pod"], labels["namespace"], labels["container"]) == ("trainer-0", "ml", "main")
    # an instance not read this cycle (first sample) and an unknown parent are left out
    assert dcgm.mig_series([M_1G], {}, {0: G0}, None) == []
    assert dcgm.mig_series([M_1G], activity, {}, None) == []


def test_prof_fields_are_ratios_and_bytes_per_second_as_in_dcgm() -> None:
    read = TierRead(True, (GpuRead(G0, True, read_of(
        ("gpm", "sm", 81.0), ("gpm", "tensor_any", 48.0), ("gpm", "dram", 52.0), ("gpm", "pcie_tx", 2.0),
        ("gpm", "nvlink_rx", 1.5), ("nvlink_errors", "replay_total", 30.0), ("nvlink_errors", "replay@1", 30.0))),),)
    s = {k: v[0][1] for k, v in by_name(DcgmCompat(hostname="n1").tier_series(read, "570.1")).items()}
    assert s == {"DCGM_FI_PROF_SM_ACTIVE": 0.81, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.48,  # GPM % → ratio
                 "DCGM_FI_PROF_DRAM_ACTIVE": 0.52,
                 "DCGM_FI_PROF_PCIE_TX_BYTES": 2 * 1048576.0, "DCGM_FI_PROF_NVLINK_RX_BYTES": 1.5 * 1048576.0,
                 "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 30.0}  # the per-link value has no dcgm row
    assert all(not f.labels for f in DCGM_CATALOGUE)


def test_values_are_in_dcgm_exporters_units() -> None:
    read = TierRead(True, (GpuRead(G0, True, read_of(
        ("temperature", "gpu", 71.0), ("power", "watts", 412_345.0), ("sm_clock", "current", 1980.0),
        ("utilization", "gpu", 87.0), ("utilization", "memory", 40.0), ("energy", "total", 5_000.0),
        ("memory", "used", 3 * 1048576.0), ("memory", "free", 1048576.0 / 2), ("memory", "total", 8e9),
        ("fields_fast", "memory_temp", 80.0))),),)
    s = {k: v[0][1] for k, v in by_name(DcgmCompat(hostname="n1").tier_series(read, "570.1")).items()}
    assert s == {"DCGM_FI_DEV_GPU_TEMP": 71.0, "DCGM_FI_DEV_POWER_USAGE": 412.345,  # W
                 "DCGM_FI_DEV_SM_CLOCK": 1980.0,  # MHz
                 "DCGM_FI_DEV_GPU_UTIL": 87.0, "DCGM_FI_DEV_MEM_COPY_UTIL": 40.0,  # %
                 "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 5000.0,  # mJ
                 "DCGM_FI_DEV_FB_USED": 3.0, "DCGM_FI_DEV_FB_FREE": 0.5,  # MiB
                 "DCGM_FI_DEV_MEMORY_TEMP": 80.0}


def test_labels_are_dcgm_exporters_with_either_hostname_spelling() -> None:
    assert dict(dcgm_labels(G0, hostname="n1", hostname_label="Hostname", driver_version="570.1")) == {
        "gpu": "0", "UUID": G0.uuid, "pci_bus_id": "00000000:18:00.0", "device": "nvidia2",
        "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "n1", "DCGM_FI_DRIVER_VERSION": "570.1"}
    lower = dict(dcgm_labels(G1, hostname="n1", hostname_label="hostname", driver_version=None))
    assert lower["hostname"] == "n1" and "Hostname" not in lower
    assert lower["device"] == "nvidia1"  # no minor number: the index, as /dev/nvidiaN usually is
    assert "DCGM_FI_DRIVER_VERSION" not in lower  # unknown is left out, never ""


def test_a_lost_gpu_exports_no_stale_dcgm_values() -> None:
    read = TierRead(True, (GpuRead(G0, False, read_of(("temperature", "gpu", 71.0))),
                           GpuRead(G1, True, read_of(("temperature", "gpu", 60.0)))))
    temps = by_name(DcgmCompat(hostname="n").tier_series(read, None))["DCGM_FI_DEV_GPU_TEMP"]
    assert [labels["gpu"] for labels, _ in temps] == ["1"]


def test_xid_gauge_is_the_last_code_and_zero_without_one() -> None:
    s = by_name(DcgmCompat(hostname="n").xid_series({1: 79}, [G0, G1], None))["DCGM_FI_DEV_XID_ERRORS"]
    assert [(labels["gpu"], v) for labels, v in s] == [("0", 0.0), ("1", 79.0)]


def test_the_switch_is_off_by_default_and_validated() -> None:
    assert AgentConfig.default().exposition.dcgm_compat.enabled is False
    on = AgentConfig.model_validate({"exposition": {"dcgm_compat": {"enabled": True, "hostname_label": "hostname"}}})
    assert on.exposition.dcgm_compat.hostname_label == "hostname"
    with pytest.raises(ValidationError) as e:
        AgentConfig.model_validate({"exposition": {"dcgm_compat": {"hostname_label": "host"}}})
    assert "exposition.dcgm_compat.hostname_label" in validation_problem(e.value)
    with pytest.raises(ValueError, match="hostname_label"):
        DcgmCompat(hostname="n", hostname_label="HOST")
