"""Why a query costs what it does on VictoriaMetrics: one query shape against another, at the fleet's instant.

Used by `fleet_scale.py --fetch-only`: after the synthetic scrapes are imported, each variant runs alone `repeat`
times, one after another, and the median wall and VictoriaMetrics CPU (its /proc stat, so other processes on the
machine do not count) is reported with the series it returned.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import _bench

POWER = "gpumond_gpu_power_watts"
THROTTLE = 'gpumond_gpu_clocks_event_active{reason=~"hw_power_brake_slowdown|hw_slowdown|hw_thermal_slowdown|' \
           'sw_power_cap|sw_thermal_slowdown"}'
GAUGES = ("gpumond_gpu_sm_clock_hertz", POWER, "gpumond_gpu_utilization_ratio", "gpumond_gpu_temperature_celsius",
          "gpumond_gpu_energy_joules_total", "gpumond_gpu_up")


def variants(mask: str) -> list[tuple[str, str, dict[str, str]]]:
    """(what, query, extra params): the same answer asked in different ways, and the throttle query's shapes."""
    lean = f"max by (uuid) ({POWER})"
    return [
        ("one gauge, as sent (instant, nocache=1)", lean, {}),
        ("… without nocache", lean, {"nocache": ""}),
        ("… step=30s (the instant query's lookback)", lean, {"step": "30s"}),
        ("… last_over_time(x[30s])", f"max by (uuid) (last_over_time({POWER}[30s]))", {}),
        ("… the bare selector (no max by)", POWER, {}),
        ("… count only (no series in the answer)", f"count({POWER})", {}),
        (f"{len(GAUGES)} gauges, one regex query", f'max by (uuid, __name__) ({{__name__=~"{"|".join(GAUGES)}"}})',
         {}),
        (f"{len(GAUGES)} gauges, one query each (summed)", "|".join(GAUGES), {}),
        ("throttle per reason `!= 0` (5 series a GPU)", f"max by (uuid, reason) ({THROTTLE}) != 0", {}),
        ("throttle per reason, count only", f"count({THROTTLE})", {}),
        ("throttle bitmask `!= 0` (1 series a GPU)", f"max by (uuid) ({mask}) != 0", {}),
        ("throttle bitmask in full", f"max by (uuid) ({mask})", {}),
    ]


def measure(get: Callable[[str, dict[str, str]], tuple[int, int]], vm_pid: int, query: str, extra: dict[str, str],
            repeat: int) -> tuple[float, float, int, int]:
    """Median wall and VictoriaMetrics CPU of `repeat` runs; the series and bytes of the last."""
    walls, cpus, got = [], [], (0, 0)
    for _ in range(repeat):
        vm0, t0 = _bench.proc_cpu_s(vm_pid), time.perf_counter()
        got = get(query, extra)
        walls.append(time.perf_counter() - t0)
        cpus.append(_bench.proc_cpu_s(vm_pid) - vm0)
    return statistics.median(walls), statistics.median(cpus), got[0], got[1]


def probe(url: str, t: float, vm_pid: int, mask: str, gpus: int, repeat: int = 5) -> list[list[str]]:
    """Every variant, measured; a `|`-joined query is run once per part and summed."""
    import httpx

    client = httpx.Client(timeout=300)

    def get(query: str, extra: dict[str, str]) -> tuple[int, int]:
        series = size = 0
        for part in query.split("|") if extra.get("_parts") else [query]:
            params = {"query": part, "time": f"{t:.3f}", "nocache": "1", **extra}
            params = {k: v for k, v in params.items() if v and not k.startswith("_")}
            r = client.get(url + "/api/v1/query", params=params)
            r.raise_for_status()
            series += len(r.json()["data"]["result"])
            size += len(r.content)
        return series, size

    rows = []
    try:
        get(f"count({POWER})", {})  # warm-up: the first query after a pause pays for caches the rest share
        for what, query, extra in variants(mask):
            if "one query each" in what:
                query, extra = "|".join(f"max by (uuid) ({g})" for g in GAUGES), {"_parts": "1"}
            wall, cpu, series, size = measure(get, vm_pid, query, extra, repeat)
            rows.append([what, f"{series:,}", f"{size / 1e6:.1f} MB", f"{wall:.2f} s", f"{cpu:.2f} s",
                         f"{cpu / gpus * 1e6:.1f} µs"])
    finally:
        client.close()
    return rows


NOTE = ("Every query but the count-only ones answers the same GPUs; `VM CPU per GPU` is its VictoriaMetrics CPU "
        "over the fleet's GPUs. The per-reason throttle query selects 5 series a GPU and answers none of them "
        "(`!= 0`, no throttling planted); the bitmask query selects 1.")


def force_merge(url: str, t: float) -> float:
    """Ask VictoriaMetrics to merge the month's partition now; seconds until it answered."""
    import httpx

    t0 = time.perf_counter()
    r = httpx.get(url + "/internal/force_merge", params={"partition_prefix": time.strftime("%Y_%m", time.gmtime(t))},
                  timeout=600)
    r.raise_for_status()
    return time.perf_counter() - t0


def table(rows: Sequence[Sequence[str]]) -> str:
    return _bench.md_table(["query", "series answered", "bytes", "wall (median)", "VictoriaMetrics CPU (median)",
                            "VM CPU per GPU"], rows)
