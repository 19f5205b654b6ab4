"""The naive exporter pattern, for comparison: read NVML and encode on every scrape.

A prometheus-client collector reads every GPU through pynvml inside `collect()`, and the server calls
`generate_latest` (gzip when asked) for each request. NVML is the same simulated library the agent
uses (8 H100s, default scenario, real-time `SimClock`), and the metric names and units mirror
gpumond's so the two expositions carry about the same series (~44 per GPU). Handles are looked up
once at start (kinder to this pattern than exporters that look them up per scrape), and the
registry holds only this collector (no process/GC collectors).

    python benchmarks/naive_exporter.py --port 9490                 # prometheus_client.start_http_server
    python benchmarks/naive_exporter.py --port 9490 --server asgi   # make_asgi_app under uvicorn (httptools
                                                                     # when installed, as the agent, unguarded)
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Iterator

import pynvml
from prometheus_client import CollectorRegistry, make_asgi_app, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpumond.nvml.sim import SimClock, SimulatedNvml

REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
VIOLATIONS = {
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP: "sw_power_cap",
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST: "sync_boost",
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: "sw_thermal_slowdown",
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: "hw_thermal_slowdown",
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: "hw_power_brake_slowdown",
}
FIELD_IDS = [pynvml.NVML_FI_DEV_MEMORY_TEMP, *VIOLATIONS]
THRESHOLDS = {"slowdown": pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
              "shutdown": pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
              "gpu_max": pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX}


def _field(entry: pynvml.c_nvmlFieldValue_t) -> float:
    t, v = entry.valueType, entry.value
    if t == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return float(v.dVal)
    if t == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return float(v.uiVal)
    return float(v.ullVal)


class NaiveGpuCollector:
    """Everything read from NVML inside collect(), i.e. on every scrape."""

    def __init__(self, hostname: str) -> None:
        self.hostname = hostname
        self.gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            self.gpus.append((str(i), pynvml.nvmlDeviceGetUUID(h), pynvml.nvmlDeviceGetName(h),
                              pynvml.nvmlDeviceGetPciInfo(h).busId, h))

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        L = ["gpu", "uuid"]  # noqa: N806
        g = {n: GaugeMetricFamily(f"gpumond_gpu_{n}", h, labels=L) for n, h in (
            ("temperature_celsius", "GPU temperature."), ("memory_temperature_celsius", "HBM temperature."),
            ("power_watts", "Power draw."), ("power_limit_watts", "Enforced power limit."),
            ("power_limit_min_watts", "Minimum settable power limit."),
            ("power_limit_max_watts", "Maximum settable power limit."),
            ("power_limit_default_watts", "Default power limit."), ("sm_clock_hertz", "SM clock."),
            ("sm_clock_max_hertz", "Maximum SM clock."), ("memory_clock_hertz", "Memory clock."),
            ("utilization_ratio", "GPU utilization."), ("memory_utilization_ratio", "Memory utilization."),
            ("memory_used_bytes", "Memory used."), ("memory_total_bytes", "Memory total."),
            ("row_remap_pending", "Row remap pending."), ("row_remap_failed", "Row remap failed."))}
        energy = CounterMetricFamily("gpumond_gpu_energy_joules", "Energy since driver load.", labels=L)
        replay = CounterMetricFamily("gpumond_gpu_pcie_replay_errors", "PCIe replays.", labels=L)
        info = GaugeMetricFamily("gpumond_gpu_info", "GPU identity.",
                                 labels=[*L, "name", "pci_bus_id", "hostname"])
        active = GaugeMetricFamily("gpumond_gpu_clocks_event_active", "Clock event active.", labels=[*L, "reason"])
        seconds = CounterMetricFamily("gpumond_gpu_clocks_event_seconds", "Clock event time.",
                                      labels=[*L, "reason"])
        ecc = CounterMetricFamily("gpumond_gpu_ecc_errors", "ECC errors.", labels=[*L, "type", "scope"])
        remapped = GaugeMetricFamily("gpumond_gpu_remapped_rows", "Remapped rows.", labels=[*L, "type"])
        thresholds = GaugeMetricFamily("gpumond_gpu_temperature_threshold_celsius", "Thresholds.",
                                       labels=[*L, "threshold"])
        for idx, uuid, name, bus, h in self.gpus:
            lv = [idx, uuid]
            info.add_metric([*lv, name, bus, self.hostname], 1)
            g["temperature_celsius"].add_metric(lv, pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))
            fields = pynvml.nvmlDeviceGetFieldValues(h, FIELD_IDS)
            for e in fields:
                if e.nvmlReturn != pynvml.NVML_SUCCESS:
                    continue
                if e.fieldId == pynvml.NVML_FI_DEV_MEMORY_TEMP:
                    g["memory_temperature_celsius"].add_metric(lv, _field(e))
                else:
                    seconds.add_metric([*lv, VIOLATIONS[e.fieldId]], _field(e) / 1e9)
            g["power_watts"].add_metric(lv, pynvml.nvmlDeviceGetPowerUsage(h) / 1000)
            g["power_limit_watts"].add_metric(lv, pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000)
            lo, hi = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
            g["power_limit_min_watts"].add_metric(lv, lo / 1000)
            g["power_limit_max_watts"].add_metric(lv, hi / 1000)
            g["power_limit_default_watts"].add_metric(lv, pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000)
            energy.add_metric(lv, pynvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000)
            g["sm_clock_hertz"].add_metric(lv, pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) * 1e6)
            g["sm_clock_max_hertz"].add_metric(lv, pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM) * 1e6)
            g["memory_clock_hertz"].add_metric(lv, pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM) * 1e6)
            u = pynvml.nvmlDeviceGetUtilizationRates(h)
            g["utilization_ratio"].add_metric(lv, u.gpu / 100)
            g["memory_utilization_ratio"].add_metric(lv, u.memory / 100)
            m = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            g["memory_used_bytes"].add_metric(lv, m.used)
            g["memory_total_bytes"].add_metric(lv, m.total)
            mask = pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
            for bit, reason in REASONS.items():
                active.add_metric([*lv, reason], 1 if mask & bit else 0)
            for t, tn in ((pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected"),
                          (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected")):
                for s, sn in ((pynvml.NVML_VOLATILE_ECC, "volatile"), (pynvml.NVML_AGGREGATE_ECC, "aggregate")):
                    ecc.add_metric([*lv, tn, sn], pynvml.nvmlDeviceGetTotalEccErrors(h, t, s))
            corr, unc, pending, failed = pynvml.nvmlDeviceGetRemappedRows(h)
            remapped.add_metric([*lv, "correctable"], corr)
            remapped.add_metric([*lv, "uncorrectable"], unc)
            g["row_remap_pending"].add_metric(lv, pending)
            g["row_remap_failed"].add_metric(lv, failed)
            replay.add_metric(lv, pynvml.nvmlDeviceGetPcieReplayCounter(h))
            for tname, which in THRESHOLDS.items():
                thresholds.add_metric([*lv, tname], pynvml.nvmlDeviceGetTemperatureThreshold(h, which))
        yield info
        yield from g.values()
        yield from (energy, replay, active, seconds, ecc, remapped, thresholds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="naive per-scrape NVML exporter over the simulator")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--server", choices=["wsgi", "asgi"], default="wsgi")
    args = ap.parse_args(argv)

    sim = SimulatedNvml(gpu_count=args.gpus, node="bench-node", clock=SimClock(1.0))
    sim.install()
    pynvml.nvmlInit()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NaiveGpuCollector("bench-node"))  # type: ignore[arg-type]
    if args.server == "asgi":
        import uvicorn

        uvicorn.run(make_asgi_app(registry), host="127.0.0.1", port=args.port, lifespan="off",
                    access_log=False, log_level="warning")
        return 0
    httpd, _thread = start_http_server(args.port, addr="127.0.0.1", registry=registry)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    httpd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
