"""GPU model specifications, as data.

Numbers are public datasheet values where they exist (memory size, power range, clocks,
temperature thresholds as `nvidia-smi -q` prints them) and round, documented choices where
they do not (idle power, thermal resistance, time constant). They are meant to give
plausible telemetry, not to predict a particular board.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# What the simulated driver reports about itself (an R570 driver with CUDA 12.8).
DRIVER_VERSION = "570.133.20"
NVML_VERSION = "12.570.133.20"
CUDA_DRIVER_VERSION = 12080

# nvmlEventType* bits (pynvml names them; repeated here so the model layer needs no pynvml).
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_PSTATE = 0x4
EVENT_XID = 0x8
EVENT_CLOCK = 0x10


MIG_SLICES = 7  # an A100 / H100 splits into seven compute slices


@dataclass(frozen=True)
class MigProfile:
    """One MIG GPU-instance profile, e.g. 1g.10gb: compute slices, memory and SMs it gets."""

    name: str
    slices: int
    memory_mib: int
    sm_count: int


def _profiles(*rows: tuple[str, int, int, int]) -> dict[str, MigProfile]:
    return {name: MigProfile(name, slices, mib, sms) for name, slices, mib, sms in rows}


@dataclass(frozen=True)
class GpuModelSpec:
    key: str
    name: str
    architecture: int  # NVML_DEVICE_ARCH_*
    compute_capability: tuple[int, int]
    brand: int  # NVML_BRAND_*
    pci_device_id: int  # (device << 16) | vendor, as nvmlPciInfo_t.pciDeviceId
    pci_subsystem_id: int
    memory_total_mib: int
    memory_reserved_mib: int  # what the driver keeps; nvmlMemory_v2_t.reserved
    # Power: the settable range and the board default, plus the demand model
    # P = idle_w + dyn_w · util · intensity · (f / f_max)^alpha.
    power_min_w: float
    power_max_w: float
    power_default_w: float
    idle_w: float
    dyn_w: float
    alpha: float  # dynamic power ∝ f·V², and V rises with f: ~f^2.5 over the DVFS range
    sm_max_mhz: int
    sm_min_mhz: int  # lowest clock the power controller may pick
    sm_idle_mhz: int  # where the clock parks when nothing runs
    mem_clock_mhz: int  # HBM runs at one fixed clock
    video_max_mhz: int
    # Thermal: first order, T_ss = T_inlet + P · r_th · cooling_factor, time constant tau.
    r_th_c_per_w: float
    tau_s: float
    mem_temp_offset_c_per_w: float | None  # HBM above die temperature; None = no sensor
    shutdown_c: int
    slowdown_c: int  # hardware thermal slowdown (HwThermalSlowdown + HwSlowdown)
    gpu_max_c: int  # software thermal slowdown target (SwThermalSlowdown)
    mem_max_c: int | None
    memory_bandwidth_share: float  # memory utilization reported per unit of SM utilization
    # Feature support, so that NOT_SUPPORTED is data and not scattered `if model ==` checks.
    has_temperature_v: bool
    has_power_fields: bool  # NVML_FI_DEV_POWER_AVERAGE / _INSTANT (185 / 186)
    has_remapped_rows: bool  # Ampere and later
    has_retired_pages: bool  # before Ampere
    has_mig: bool
    supported_events: int
    # GPU Performance Monitoring (nvmlGpm*): Hopper and later. Without it nvmlGpmQueryDeviceSupport says
    # isSupportedDevice 0 and nvmlGpmSampleGet answers NOT_SUPPORTED.
    has_gpm: bool = False
    # Activity model behind GPM (shares of the busy time; see gpu.SimGpu._accumulate).
    tensor_share: float = 0.0  # tensor-pipe activity per unit of SM activity (mixed-precision training)
    occupancy_share: float = 0.0  # resident warps / maximum, per unit of SM activity
    pcie_bytes_per_s: float = 0.0  # host traffic at full utilization (input batches, checkpoints)
    # NVLink: links per GPU, the NVML version enum of them, and data bandwidth per link and direction.
    nvlink_links: int = 0
    nvlink_version: int = 0  # NVML_NVLINK_VERSION_*
    nvlink_bytes_per_s: float = 0.0
    # MIG GPU-instance profiles this model offers: name -> (slices of 7, memory MiB, SMs). Empty without MIG.
    mig_profiles: dict[str, MigProfile] = field(default_factory=dict)


# Clock cuts when a thermal limit is hit. The software controller trims clocks moderately;
# the hardware slowdown is a blunt halving that releases only after the die cools by
# HW_SLOWDOWN_HYSTERESIS_C (the real one asserts a signal until the sensor drops).
SW_THERMAL_CLOCK_FACTOR = 0.8
SW_THERMAL_HYSTERESIS_C = 2.0
HW_THERMAL_CLOCK_FACTOR = 0.5
HW_SLOWDOWN_HYSTERESIS_C = 5.0
IDLE_UTILIZATION = 0.05  # below this the GPU reports GpuIdle and parks its clock
POWER_AVERAGE_TAU_S = 1.0  # nvmlDeviceGetPowerUsage is a ~1 s average on Hopper

_XID_AND_ECC = EVENT_XID | EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_PSTATE | EVENT_CLOCK

H100_SXM = GpuModelSpec(
    key="h100-sxm",
    name="NVIDIA H100 80GB HBM3",
    architecture=9,  # NVML_DEVICE_ARCH_HOPPER
    compute_capability=(9, 0),
    brand=14,  # NVML_BRAND_NVIDIA
    pci_device_id=0x233010DE,
    pci_subsystem_id=0x16C110DE,
    memory_total_mib=81559,
    memory_reserved_mib=580,
    power_min_w=200.0,
    power_max_w=700.0,
    power_default_w=700.0,
    idle_w=75.0,
    dyn_w=615.0,  # full load at f_max draws 690 W: just under the default limit
    alpha=2.5,
    sm_max_mhz=1980,
    sm_min_mhz=210,
    sm_idle_mhz=345,
    mem_clock_mhz=2619,
    video_max_mhz=1755,
    r_th_c_per_w=45.0 / 700.0,  # 700 W over a 30 °C inlet settles near 75 °C
    tau_s=30.0,
    mem_temp_offset_c_per_w=0.012,  # HBM ~8 °C above the die at 700 W
    shutdown_c=92,
    slowdown_c=89,
    gpu_max_c=87,
    mem_max_c=95,
    memory_bandwidth_share=0.55,
    has_temperature_v=True,
    has_power_fields=True,
    has_remapped_rows=True,
    has_retired_pages=False,
    has_mig=True,
    supported_events=_XID_AND_ECC,
    has_gpm=True,
    tensor_share=0.6,
    occupancy_share=0.45,
    pcie_bytes_per_s=2.0e9,
    nvlink_links=18,  # NVLink 4 on HGX H100: 18 links, 25 GB/s per direction each (450 GB/s)
    nvlink_version=6,  # NVML_NVLINK_VERSION_4_0
    nvlink_bytes_per_s=25.0e9 * 0.4,  # what a training job's all-reduce keeps busy on average
    # `nvidia-smi mig -lgip` on an H100 80GB: memory rounded to what the profile names, SMs per slice.
    mig_profiles=_profiles(("1g.10gb", 1, 9856, 16), ("1g.20gb", 1, 19968, 26), ("2g.20gb", 2, 19968, 32),
                           ("3g.40gb", 3, 40192, 60), ("4g.40gb", 4, 40192, 64), ("7g.80gb", 7, 80384, 132)),
)

V100_SXM2 = GpuModelSpec(
    key="v100-sxm2",
    name="Tesla V100-SXM2-32GB",
    architecture=5,  # NVML_DEVICE_ARCH_VOLTA
    compute_capability=(7, 0),
    brand=2,  # NVML_BRAND_TESLA
    pci_device_id=0x1DB510DE,
    pci_subsystem_id=0x124910DE,
    memory_total_mib=32768,
    memory_reserved_mib=306,
    power_min_w=100.0,
    power_max_w=300.0,
    power_default_w=300.0,
    idle_w=40.0,
    dyn_w=255.0,
    alpha=2.5,
    sm_max_mhz=1530,
    sm_min_mhz=135,
    sm_idle_mhz=135,
    mem_clock_mhz=877,
    video_max_mhz=1372,
    r_th_c_per_w=40.0 / 300.0,  # 300 W over a 30 °C inlet settles near 70 °C
    tau_s=25.0,
    mem_temp_offset_c_per_w=None,
    shutdown_c=90,
    slowdown_c=87,
    gpu_max_c=83,
    mem_max_c=None,
    memory_bandwidth_share=0.5,
    has_temperature_v=False,
    has_power_fields=False,
    has_remapped_rows=False,
    has_retired_pages=True,
    has_mig=False,
    supported_events=_XID_AND_ECC,
    has_gpm=False,  # Volta: no GPM (DCGM's profiling fields only)
    nvlink_links=6,  # NVLink 2 on SXM2: 6 links, 25 GB/s per direction each
    nvlink_version=2,  # NVML_NVLINK_VERSION_2_0
    nvlink_bytes_per_s=25.0e9 * 0.4,
)

MODELS: dict[str, GpuModelSpec] = {m.key: m for m in (H100_SXM, V100_SXM2)}
DEFAULT_MODEL = H100_SXM.key

# Bus numbers of the eight GPUs on an HGX H100 baseboard; further GPUs take free numbers.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
MAX_GPUS = 64


def pci_bus_number(index: int) -> int:
    if index < len(_HGX_BUSES):
        return _HGX_BUSES[index]
    spare = [b for b in range(0x01, 0x100) if b not in _HGX_BUSES]
    return spare[index - len(_HGX_BUSES)]
