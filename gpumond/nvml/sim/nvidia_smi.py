"""The driver's own view of simulated GPUs: a small `nvidia-smi` that reads them through pynvml.

    python -m gpumond.nvml.sim.nvidia_smi --sim 3 --sim-scenario FILE --node-name NODE \\
        --query-gpu=uuid,temperature.gpu,power.draw --format=csv,noheader,nounits

nvidia-smi is the driver's tool and cannot run without one, so the field check (benchmarks/gpu_field_check.py)
compares the agent with this stand-in when it runs against `gpumond agent --sim`. It builds the same simulated
node the agent builds (same GPU count, scenario and node name, so the same UUIDs) and reads it through pynvml's
real calls, as nvidia-smi reads libnvidia-ml. Two processes share no simulated time, so their dynamic readings
agree only where the scenario holds each GPU at a steady state (a constant load without noise, a constant inlet).

It answers the forms the field check uses: `--query-gpu=… --format=csv,noheader,nounits`, `--help-query-gpu`,
and no arguments (the banner with the driver and CUDA versions). A field its GPU does not support prints
`[Not Supported]`, as nvidia-smi does.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml as N

from .simulator import SimulatedNvml

MIB = 1024 * 1024


def _enabled(value: int) -> str:
    return "Enabled" if value else "Disabled"


def _memory(h: Any) -> Any:
    return N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _field(h: Any, field_id: int) -> int:
    """One NVML field value; a field can fail on its own while the call succeeds."""
    value = N.nvmlDeviceGetFieldValues(h, [field_id])[0]
    if value.nvmlReturn != N.NVML_SUCCESS:
        raise N.NVMLError(value.nvmlReturn)
    return int(value.value.uiVal)


def _power_w(milliwatts: int) -> str:
    return f"{milliwatts / 1000:.2f}"


# nvidia-smi's field name → its reading of one device handle, as nvidia-smi prints it with `nounits`.
FIELDS: dict[str, Callable[[Any], str]] = {
    "index": lambda h: str(N.nvmlDeviceGetIndex(h)),
    "uuid": lambda h: N.nvmlDeviceGetUUID(h),
    "name": lambda h: N.nvmlDeviceGetName(h),
    "pci.bus_id": lambda h: _text(N.nvmlDeviceGetPciInfo_v3(h).busId),
    "driver_version": lambda h: N.nvmlSystemGetDriverVersion(),
    "temperature.gpu": lambda h: str(N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU)),
    "temperature.memory": lambda h: str(_field(h, N.NVML_FI_DEV_MEMORY_TEMP)),
    "power.draw": lambda h: _power_w(N.nvmlDeviceGetPowerUsage(h)),
    "power.draw.average": lambda h: _power_w(_field(h, N.NVML_FI_DEV_POWER_AVERAGE)),
    "power.draw.instant": lambda h: _power_w(_field(h, N.NVML_FI_DEV_POWER_INSTANT)),
    "power.limit": lambda h: _power_w(N.nvmlDeviceGetPowerManagementLimit(h)),
    "enforced.power.limit": lambda h: _power_w(N.nvmlDeviceGetEnforcedPowerLimit(h)),
    "power.default_limit": lambda h: _power_w(N.nvmlDeviceGetPowerManagementDefaultLimit(h)),
    "power.min_limit": lambda h: _power_w(N.nvmlDeviceGetPowerManagementLimitConstraints(h)[0]),
    "power.max_limit": lambda h: _power_w(N.nvmlDeviceGetPowerManagementLimitConstraints(h)[1]),
    "clocks.sm": lambda h: str(N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM)),
    "clocks.mem": lambda h: str(N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM)),
    "clocks.max.sm": lambda h: str(N.nvmlDeviceGetMaxClockInfo(h, N.NVML_CLOCK_SM)),
    "clocks.applications.graphics": lambda h: str(N.nvmlDeviceGetApplicationsClock(h, N.NVML_CLOCK_GRAPHICS)),
    "clocks.applications.memory": lambda h: str(N.nvmlDeviceGetApplicationsClock(h, N.NVML_CLOCK_MEM)),
    "utilization.gpu": lambda h: str(N.nvmlDeviceGetUtilizationRates(h).gpu),
    "utilization.memory": lambda h: str(N.nvmlDeviceGetUtilizationRates(h).memory),
    "memory.total": lambda h: str(_memory(h).total // MIB),
    "memory.reserved": lambda h: str(_memory(h).reserved // MIB),
    "memory.used": lambda h: str(_memory(h).used // MIB),
    "ecc.mode.current": lambda h: _enabled(N.nvmlDeviceGetEccMode(h)[0]),
    "ecc.errors.corrected.volatile.total": lambda h: str(N.nvmlDeviceGetTotalEccErrors(
        h, N.NVML_MEMORY_ERROR_TYPE_CORRECTED, N.NVML_VOLATILE_ECC)),
    "ecc.errors.uncorrected.volatile.total": lambda h: str(N.nvmlDeviceGetTotalEccErrors(
        h, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_VOLATILE_ECC)),
    "ecc.errors.corrected.aggregate.total": lambda h: str(N.nvmlDeviceGetTotalEccErrors(
        h, N.NVML_MEMORY_ERROR_TYPE_CORRECTED, N.NVML_AGGREGATE_ECC)),
    "ecc.errors.uncorrected.aggregate.total": lambda h: str(N.nvmlDeviceGetTotalEccErrors(
        h, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_AGGREGATE_ECC)),
    "clocks_event_reasons.active": lambda h: f"0x{N.nvmlDeviceGetCurrentClocksEventReasons(h):016X}",
    "pcie.link.gen.current": lambda h: str(N.nvmlDeviceGetCurrPcieLinkGeneration(h)),
    "pcie.link.width.current": lambda h: str(N.nvmlDeviceGetCurrPcieLinkWidth(h)),
    "pcie.link.gen.max": lambda h: str(N.nvmlDeviceGetMaxPcieLinkGeneration(h)),
    "pcie.link.width.max": lambda h: str(N.nvmlDeviceGetMaxPcieLinkWidth(h)),
    "compute_mode": lambda h: {0: "Default", 2: "Prohibited", 3: "Exclusive_Process"}.get(
        N.nvmlDeviceGetComputeMode(h), "Unknown"),
    "vbios_version": lambda h: N.nvmlDeviceGetVbiosVersion(h),
    "persistence_mode": lambda h: _enabled(N.nvmlDeviceGetPersistenceMode(h)),
    "mig.mode.current": lambda h: _enabled(N.nvmlDeviceGetMigMode(h)[0]),
}


def _value(read: Callable[[Any], str], handle: Any) -> str:
    try:
        return read(handle)
    except (N.NVMLError_NotSupported, N.NVMLError_FunctionNotFound):
        return "[Not Supported]"
    except N.NVMLError:
        return "[N/A]"


def query(fields: list[str], fmt: str) -> str:
    """The CSV nvidia-smi prints for `--query-gpu=<fields> --format=<fmt>`, one line per GPU."""
    unknown = [f for f in fields if f not in FIELDS]
    if unknown:
        raise SystemExit(f'Field "{unknown[0]}" is not a valid field to query.')
    if set(fmt.split(",")) != {"csv", "noheader", "nounits"}:
        raise SystemExit("this simulated nvidia-smi prints --format=csv,noheader,nounits only")
    lines = []
    for i in range(N.nvmlDeviceGetCount()):
        h = N.nvmlDeviceGetHandleByIndex(i)
        lines.append(", ".join(_value(FIELDS[f], h) for f in fields))
    return "\n".join(lines)


def banner() -> str:
    cuda = N.nvmlSystemGetCudaDriverVersion()
    return (f"| NVIDIA-SMI (simulated)   Driver Version: {N.nvmlSystemGetDriverVersion()}   "
            f"CUDA Version: {cuda // 1000}.{cuda % 1000 // 10} |")


def help_query() -> str:
    return "List of valid properties to query for the switch \"--query-gpu=\":\n\n" + "\n".join(
        f'"{name}"' for name in FIELDS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpumond.nvml.sim.nvidia_smi", description=__doc__.split("\n")[0])
    ap.add_argument("--sim", type=int, required=True, metavar="GPUS", help="as `gpumond agent --sim`")
    ap.add_argument("--sim-scenario", type=Path, metavar="FILE", help="as `gpumond agent --sim-scenario`")
    ap.add_argument("--node-name", default="gpu-node-01", help="as `gpumond agent --node-name` (names the UUIDs)")
    ap.add_argument("--query-gpu")
    ap.add_argument("--format", default="csv,noheader,nounits")
    ap.add_argument("--help-query-gpu", action="store_true")
    args = ap.parse_args(argv)
    sim = SimulatedNvml(gpu_count=args.sim, node=args.node_name, scenario=args.sim_scenario)
    with sim:
        N.nvmlInit()
        try:
            if args.help_query_gpu:
                print(help_query())
            elif args.query_gpu:
                print(query([f.strip() for f in args.query_gpu.split(",")], args.format))
            else:
                print(banner())
        finally:
            N.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
