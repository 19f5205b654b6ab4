"""State of one simulated GPU and its lazy time integration.

A GPU only integrates when somebody looks at it (`advance(t)`), in steps of at most
MAX_STEP_S and never across a change of its load, so the result is the same whether it is
polled every millisecond or once a minute. Fault effects are derived from the set of
active faults, so overlapping faults compose (cooling factors multiply, inlet deltas add,
the most recent `load` wins).
"""

from __future__ import annotations

import ctypes
import time
import uuid as uuidlib

from . import physics
from .models import POWER_AVERAGE_TAU_S, GpuModelSpec, MigProfile, pci_bus_number
from .scenario import Fault, InletProfile, LoadPattern

MAX_STEP_S = 1.0  # thermal slowdown reacts within a simulated second
MIN_ADVANCE_S = 1e-3  # calls closer together than this share one state: keeps calls cheap
_MAX_STEPS_PER_ADVANCE = 20000  # a long unobserved gap uses coarser steps instead of more

# Reasons whose active time NVML reports in ns through field values.
COUNTED_REASONS = (physics.REASON_SW_POWER_CAP, physics.REASON_SYNC_BOOST, physics.REASON_SW_THERMAL,
                   physics.REASON_HW_THERMAL, physics.REASON_HW_POWER_BRAKE)

_UUID_NAMESPACE = uuidlib.uuid5(uuidlib.NAMESPACE_DNS, "sim.gpumond")

XID_GPU_FELL_OFF_BUS = 79

# GPM counters (see SimGpu._accumulate) and NVLink error counters (nvmlNvLinkErrorCounter_t order).
ACTIVITY_KEYS = ("graphics", "sm", "occupancy", "tensor", "hmma", "fp32", "fp16", "fp64", "dram",
                 "pcie_rx", "pcie_tx")
NVLINK_ERRORS = ("replay", "recovery", "crc_flit", "crc_data")


def gpu_uuid(node: str, index: int) -> str:
    return "GPU-" + str(uuidlib.uuid5(_UUID_NAMESPACE, f"{node}/{index}"))


class SimMigDevice:
    """One MIG device (a GPU instance with one full compute instance) of a MIG-enabled SimGpu.

    What NVML reports per instance lives here (UUID, name with the profile, memory, processes);
    temperature, power and clocks belong to the parent and are NOT_SUPPORTED on a MIG handle.
    """

    def __init__(self, parent: SimGpu, index: int, gpu_instance: int, profile: MigProfile) -> None:
        self.parent = parent
        self.index = index  # as nvmlDeviceGetMigDeviceHandleByIndex numbers it
        self.gpu_instance = gpu_instance
        self.compute_instance = 0  # one compute instance spanning the GPU instance
        self.profile = profile
        # R470+ drivers name a MIG device `MIG-<uuid>`; the name carries the profile, as nvidia-smi -L shows.
        self.uuid = "MIG-" + str(uuidlib.uuid5(_UUID_NAMESPACE, f"{parent.uuid}/{gpu_instance}/0"))
        self.name = f"{parent.name} MIG {profile.name}"
        self._handle_buffer = ctypes.create_string_buffer(16)
        self.handle = ctypes.addressof(self._handle_buffer)
        self.processes: list[int] = []

    @property
    def memory_total_bytes(self) -> int:
        return self.profile.memory_mib * 1024 * 1024

    @property
    def memory_used_bytes(self) -> int:
        # An instance with nothing running holds only the driver's context-free minimum.
        fraction = physics.memory_used_fraction(self.parent.load) if self.processes else 0.005
        return int(self.memory_total_bytes * fraction)


class SimGpu:
    def __init__(self, index: int, node: str, spec: GpuModelSpec, base_load: LoadPattern,
                 inlet: InletProfile, inlet_offset_c: float, seed: int, t0: float) -> None:
        self.index = index
        self.spec = spec
        self.model = spec.key
        self.name = spec.name
        self.uuid = gpu_uuid(node, index)
        self.serial = str(1650000000000 + int(self.uuid[4:12], 16) % 10**9)
        self.pci_bus = pci_bus_number(index)
        self.pci_bus_id = f"{0:08X}:{self.pci_bus:02X}:00.0"
        # nvmlDevice_t is an opaque pointer: hand out the address of a buffer we own and keep.
        self._handle_buffer = ctypes.create_string_buffer(16)
        self.handle = ctypes.addressof(self._handle_buffer)

        self.base_load = base_load
        self.inlet = inlet
        self.inlet_offset_c = inlet_offset_c
        self._noise_key = seed * 1_000_003 + index
        self.power_limit_w = spec.power_default_w
        self.processes: list[int] = []
        self.mig: list[SimMigDevice] = []  # empty: MIG mode off

        # Fault-derived parameters (see _derive).
        self._active: dict[int, Fault] = {}
        self.cooling_factor = 1.0
        self.inlet_delta_c = 0.0
        self.slow_factor = 1.0
        self.load = base_load
        self.lost = False
        self.device_calls = 0
        self.no_permission_on_set = False

        # Counters.
        self.ecc = {("corrected", "volatile"): 0, ("corrected", "aggregate"): 0,
                    ("uncorrected", "volatile"): 0, ("uncorrected", "aggregate"): 0}
        self.remapped_correctable = 0
        self.remapped_uncorrectable = 0
        self.remap_pending = False
        self.remap_failure = False  # derived: a remap_failure fault is active
        self.retired_pages: list[tuple[int, int, int]] = []  # (address, cause, unix time)
        self.pcie_replay = 0
        self.xid_counts: dict[int, int] = {}
        self.violation_ns = {bit: 0.0 for bit in COUNTED_REASONS}
        # GPM's counters: time integrals of each activity (seconds busy) and bytes moved; a GPM sample is a
        # copy of them, and a metric is the difference of two samples over the time between them.
        self.activity = dict.fromkeys(ACTIVITY_KEYS, 0.0)
        links = spec.nvlink_links
        self.nvlink_up = [True] * links
        self.nvlink_tx_bytes = [0.0] * links
        self.nvlink_rx_bytes = [0.0] * links
        self.nvlink_errors = [dict.fromkeys(NVLINK_ERRORS, 0.0) for _ in range(links)]
        self._nvlink_replay_rate = [0.0] * links  # replays/s on a degraded link (0: healthy)
        self.sm_activity_factor = physics.sm_activity_factor(base_load, None)

        # Physics state, starting in equilibrium with the load at t0.
        self.t = t0
        self.energy_j = 0.0
        self._hw_slow = False
        self._sw_slow = False
        self.utilization = 0.0
        self.sm_clock_mhz = float(spec.sm_idle_mhz)
        self.power_w = spec.idle_w
        self.clock_event_reasons = 0
        self.temperature_c = self._inlet(t0)
        self._refresh(t0)
        self.temperature_c = physics.steady_temperature(spec, self._inlet(t0), self.power_w, 1.0)
        self._refresh(t0)
        self.power_avg_w = self.power_w

    def enable_mig(self, profiles: list[MigProfile]) -> None:
        """MIG mode on with one instance per profile; GPU instance ids are numbered from 1 in order."""
        self.mig = [SimMigDevice(self, i, i + 1, p) for i, p in enumerate(profiles)]

    @property
    def mig_enabled(self) -> bool:
        return bool(self.mig)

    # ---- readable model state -------------------------------------------------------
    @property
    def memory_temperature_c(self) -> float | None:
        return physics.memory_temperature(self.spec, self.temperature_c, self.power_w)

    @property
    def memory_total_bytes(self) -> int:
        return self.spec.memory_total_mib * 1024 * 1024

    @property
    def memory_reserved_bytes(self) -> int:
        return self.spec.memory_reserved_mib * 1024 * 1024

    @property
    def memory_used_bytes(self) -> int:
        usable = self.memory_total_bytes - self.memory_reserved_bytes
        return int(usable * physics.memory_used_fraction(self.load))

    @property
    def memory_utilization(self) -> float:
        return min(1.0, self.utilization * self.spec.memory_bandwidth_share)

    @property
    def video_utilization(self) -> tuple[float, float]:
        """(encoder, decoder) busy share: what the load sets, while the GPU is on the bus."""
        load = self.load
        return (0.0, 0.0) if self.lost else (load.encoder_utilization, load.decoder_utilization)

    # ---- time -----------------------------------------------------------------------
    def _inlet(self, t: float) -> float:
        return physics.inlet_at(self.inlet, t) + self.inlet_offset_c + self.inlet_delta_c

    def _util(self, t: float) -> float:
        # A GPU that fell off the bus takes its job down with it.
        return 0.0 if self.lost else physics.utilization_at(self.load, t, self._noise_key)

    def _refresh(self, t: float) -> None:
        """Recompute the instantaneous operating point at t from the current state."""
        spec = self.spec
        self._hw_slow, self._sw_slow = physics.thermal_flags(spec, self.temperature_c, self._hw_slow, self._sw_slow)
        self.utilization = self._util(t)
        self.sm_clock_mhz, self.power_w, self.clock_event_reasons = physics.operating_point(
            spec, self.utilization, self.load.intensity, self._hw_slow, self._sw_slow,
            self.slow_factor, self.power_limit_w)

    def advance(self, t_target: float) -> None:
        t = self.t
        if t_target - t < MIN_ADVANCE_S:
            return
        spec = self.spec
        max_step = max(MAX_STEP_S, (t_target - t) / _MAX_STEPS_PER_ADVANCE)
        while t < t_target:
            end = min(t_target, t + max_step, physics.next_load_change(self.load, t))
            if end <= t:  # float edge case exactly on a load edge
                end = min(t_target, t + max_step)
            h = end - t
            self._refresh(0.5 * (t + end))  # load is constant on [t, end): sample mid-step
            power = self.power_w
            target = physics.steady_temperature(spec, self._inlet(t + 0.5 * h), power, self.cooling_factor)
            self.temperature_c = physics.relax(self.temperature_c, target, h, spec.tau_s)
            self.power_avg_w = physics.relax(self.power_avg_w, power, h, POWER_AVERAGE_TAU_S)
            self.energy_j += power * h
            self._accumulate(h)
            reasons = self.clock_event_reasons
            for bit in COUNTED_REASONS:
                if reasons & bit:
                    self.violation_ns[bit] += h * 1e9
            t = end
        self.t = t
        self._refresh(t)

    def _accumulate(self, h: float) -> None:
        """Add `h` seconds at the current operating point to the GPM and NVLink counters."""
        spec, acc, u = self.spec, self.activity, self.utilization
        sm = u * self.sm_activity_factor
        tensor = sm * spec.tensor_share
        acc["graphics"] += h * u
        acc["sm"] += h * sm
        acc["occupancy"] += h * sm * spec.occupancy_share
        acc["tensor"] += h * tensor
        acc["hmma"] += h * tensor  # mixed-precision training: every tensor instruction is FP16/BF16/TF32
        acc["fp32"] += h * sm * 0.2
        acc["fp16"] += h * sm * 0.1
        acc["fp64"] += h * sm * 0.01
        acc["dram"] += h * min(1.0, sm * spec.memory_bandwidth_share / 0.85)
        acc["pcie_rx"] += h * u * spec.pcie_bytes_per_s * 0.7  # batches in
        acc["pcie_tx"] += h * u * spec.pcie_bytes_per_s * 0.3
        per_link = h * u * spec.nvlink_bytes_per_s
        for link in range(spec.nvlink_links):
            if not self.nvlink_up[link]:
                continue
            rate = self._nvlink_replay_rate[link]
            moved = per_link * (0.5 if rate else 1.0)  # replays eat the link's bandwidth
            self.nvlink_tx_bytes[link] += moved
            self.nvlink_rx_bytes[link] += moved
            if rate:
                errors = self.nvlink_errors[link]
                errors["replay"] += rate * h
                errors["crc_flit"] += rate * 0.5 * h
                errors["crc_data"] += rate * 0.01 * h

    def set_power_limit(self, watts: float) -> None:
        self.power_limit_w = watts
        self._refresh(self.t)  # the power controller reacts at once

    # ---- faults ---------------------------------------------------------------------
    def start_fault(self, fault_id: int, fault: Fault) -> None:
        self._active[fault_id] = fault
        self._derive()

    def end_fault(self, fault_id: int) -> None:
        fault = self._active.pop(fault_id, None)
        if fault is not None and fault.kind == "lost" and not any(
                f.kind == "lost" for f in self._active.values()):
            self._reset()
        self._derive()

    def _derive(self) -> None:
        cooling, inlet, slow = 1.0, 0.0, 1.0
        load = self.base_load
        lost = no_perm = failure = False
        busy_idle: float | None = None
        links_down: set[int] = set()
        replay = [0.0] * self.spec.nvlink_links
        for fault in self._active.values():  # insertion order: the latest load wins
            kind = fault.kind
            if kind == "cooling":
                cooling *= fault.factor or 1.0
            elif kind == "inlet":
                inlet += fault.delta_c or 0.0
            elif kind == "slow":
                slow *= fault.factor or 1.0
            elif kind == "load":
                load = fault.load_pattern()
            elif kind == "lost":
                lost = True
            elif kind == "no_permission_on_set":
                no_perm = True
            elif kind == "remap_failure":
                failure = True
            elif kind == "busy_idle":
                busy_idle = fault.factor or 0.05
            elif kind == "nvlink_degraded":
                replay[fault.link or 0] += fault.rate or 2000.0
            elif kind == "nvlink_down":
                links_down.add(fault.link or 0)
        if busy_idle is not None:
            # A kernel always runs (utilization holds) but does almost nothing: power falls with the work.
            load = load.model_copy(update={"intensity": min(load.intensity, 0.3)})
        for link in range(self.spec.nvlink_links):
            up = link not in links_down
            if self.nvlink_up[link] and not up:
                self.nvlink_errors[link]["recovery"] += 1  # the link layer tried to retrain it
            self.nvlink_up[link] = up
        self._nvlink_replay_rate = replay
        self.sm_activity_factor = physics.sm_activity_factor(load, busy_idle)
        self.cooling_factor, self.inlet_delta_c, self.slow_factor = cooling, inlet, slow
        self.load, self.lost, self.no_permission_on_set = load, lost, no_perm
        self.remap_failure = failure
        self._refresh(self.t)

    def _reset(self) -> None:
        """What a GPU reset does to the counters: volatile ECC clears, pending remaps apply."""
        self.ecc[("corrected", "volatile")] = 0
        self.ecc[("uncorrected", "volatile")] = 0
        self.remap_pending = False

    def record_xid(self, code: int, count: int = 1) -> None:
        self.xid_counts[code] = self.xid_counts.get(code, 0) + count

    def add_ecc(self, kind: str, count: int) -> None:
        self.ecc[(kind, "volatile")] += count
        self.ecc[(kind, "aggregate")] += count
        if kind != "uncorrected":
            return
        if self.spec.has_remapped_rows:
            # Ampere+: the bad row is remapped in the InfoROM now and takes effect at reset.
            self.remapped_uncorrectable += count
            self.remap_pending = True
        elif self.spec.has_retired_pages:
            for _ in range(count):
                address = 0x10000 * (self.index + 1) + 0x1000 * len(self.retired_pages)
                self.retired_pages.append((address, 1, int(time.time())))  # 1: DOUBLE_BIT_ECC cause
