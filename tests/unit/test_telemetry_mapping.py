"""Pure mapping of an agent exposition to GpuSample / HostSample, on a trimmed real exposition."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpumond.rules.telemetry import GPU_SERIES, HOST_SERIES, read_agent
from gpumond.rules.types import GPU_SIGNALS, HOST_SIGNALS

U0 = "GPU-d2d2544c-689b-5087-bdbd-ea07f41b5806"
U1 = "GPU-a8c57d47-7419-54ce-a816-ce1029736ad6"
U2 = "GPU-0c1e0f55-1111-5222-8333-944455556666"

# From `gpumond agent --sim 3 --node-name gpu-node-07`, trimmed; then edited: GPU 0 runs a job and is
# power-capped, GPU 1 lacks die temperature and max SM clock (NVML "not supported"), GPU 2 is lost.
GOLDEN = f"""\
# HELP gpumond_build_info Build of the running agent; always 1.
# TYPE gpumond_build_info gauge
gpumond_build_info{{version="0.1.0"}} 1.0
# HELP gpumond_gpu_clocks_event_active 1 while the clock-event (throttle) reason is active, by reason.
# TYPE gpumond_gpu_clocks_event_active gauge
gpumond_gpu_clocks_event_active{{gpu="0",reason="gpu_idle",uuid="{U0}"}} 0.0
gpumond_gpu_clocks_event_active{{gpu="0",reason="sw_power_cap",uuid="{U0}"}} 1.0
gpumond_gpu_clocks_event_active{{gpu="0",reason="hw_slowdown",uuid="{U0}"}} 0.0
gpumond_gpu_clocks_event_active{{gpu="0",reason="sw_thermal_slowdown",uuid="{U0}"}} 0.0
gpumond_gpu_clocks_event_active{{gpu="0",reason="hw_thermal_slowdown",uuid="{U0}"}} 0.0
gpumond_gpu_clocks_event_active{{gpu="0",reason="hw_power_brake_slowdown",uuid="{U0}"}} 0.0
gpumond_gpu_clocks_event_active{{gpu="1",reason="sw_power_cap",uuid="{U1}"}} 0.0
gpumond_gpu_clocks_event_active{{gpu="1",reason="hw_slowdown",uuid="{U1}"}} 0.0
gpumond_gpu_clocks_event_active{{gpu="1",reason="sw_thermal_slowdown",uuid="{U1}"}} 0.0
gpumond_gpu_clocks_event_active{{gpu="1",reason="hw_thermal_slowdown",uuid="{U1}"}} 1.0
gpumond_gpu_clocks_event_active{{gpu="1",reason="hw_power_brake_slowdown",uuid="{U1}"}} 0.0
# HELP gpumond_gpu_energy_joules_total Energy consumed since the driver was loaded.
# TYPE gpumond_gpu_energy_joules_total counter
gpumond_gpu_energy_joules_total{{gpu="0",uuid="{U0}"}} 3312.168
gpumond_gpu_energy_joules_total{{gpu="1",uuid="{U1}"}} 3299.189
# HELP gpumond_gpu_info Identity of each GPU; always 1.
# TYPE gpumond_gpu_info gauge
gpumond_gpu_info{{gpu="0",hostname="gpu-node-07",name="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:18:00.0",uuid="{U0}"}} 1.0
gpumond_gpu_info{{gpu="1",hostname="gpu-node-07",name="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:2A:00.0",uuid="{U1}"}} 1.0
gpumond_gpu_info{{gpu="2",hostname="gpu-node-07",name="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:3A:00.0",uuid="{U2}"}} 1.0
# HELP gpumond_gpu_job_info 1 for each job found running on the GPU.
# TYPE gpumond_gpu_job_info gauge
gpumond_gpu_job_info{{gpu="0",job="llama-70b-r3",uuid="{U0}"}} 1.0
gpumond_gpu_job_info{{gpu="0",job="eval-7",uuid="{U0}"}} 1.0
# HELP gpumond_gpu_power_limit_watts Power limit the driver enforces now (all constraints combined).
# TYPE gpumond_gpu_power_limit_watts gauge
gpumond_gpu_power_limit_watts{{gpu="0",uuid="{U0}"}} 700.0
gpumond_gpu_power_limit_watts{{gpu="1",uuid="{U1}"}} 650.0
# HELP gpumond_gpu_power_watts Board power draw averaged over ~1 s.
# TYPE gpumond_gpu_power_watts gauge
gpumond_gpu_power_watts{{gpu="0",uuid="{U0}"}} 662.24
gpumond_gpu_power_watts{{gpu="1",uuid="{U1}"}} 655.914
# HELP gpumond_gpu_sm_clock_hertz Current SM clock.
# TYPE gpumond_gpu_sm_clock_hertz gauge
gpumond_gpu_sm_clock_hertz{{gpu="0",uuid="{U0}"}} 1.755e+09
gpumond_gpu_sm_clock_hertz{{gpu="1",uuid="{U1}"}} 1.98e+09
# HELP gpumond_gpu_sm_clock_max_hertz Highest SM clock the board can run.
# TYPE gpumond_gpu_sm_clock_max_hertz gauge
gpumond_gpu_sm_clock_max_hertz{{gpu="0",uuid="{U0}"}} 1.98e+09
# HELP gpumond_gpu_temperature_celsius GPU die temperature.
# TYPE gpumond_gpu_temperature_celsius gauge
gpumond_gpu_temperature_celsius{{gpu="0",uuid="{U0}"}} 72.0
# HELP gpumond_gpu_up 1 when the GPU answered NVML this cycle, 0 when lost or failing.
# TYPE gpumond_gpu_up gauge
gpumond_gpu_up{{gpu="0",uuid="{U0}"}} 1.0
gpumond_gpu_up{{gpu="1",uuid="{U1}"}} 1.0
gpumond_gpu_up{{gpu="2",uuid="{U2}"}} 0.0
# HELP gpumond_gpu_utilization_ratio Fraction of the last sample period in which any kernel ran.
# TYPE gpumond_gpu_utilization_ratio gauge
gpumond_gpu_utilization_ratio{{gpu="0",uuid="{U0}"}} 0.94
gpumond_gpu_utilization_ratio{{gpu="1",uuid="{U1}"}} 0.31
# HELP gpumond_host_cpu_iowait_ratio Host CPU fraction spent waiting on I/O since the last sample.
# TYPE gpumond_host_cpu_iowait_ratio gauge
gpumond_host_cpu_iowait_ratio 0.125
# HELP gpumond_host_cpu_utilization_ratio Host CPU busy fraction (not idle, not iowait) since the last sample.
# TYPE gpumond_host_cpu_utilization_ratio gauge
gpumond_host_cpu_utilization_ratio 0.295
# HELP gpumond_host_disk_read_bytes_total Bytes read from whole physical disks.
# TYPE gpumond_host_disk_read_bytes_total counter
gpumond_host_disk_read_bytes_total 1.547396096e+09
# HELP gpumond_host_memory_used_bytes Host memory in use (total minus available).
# TYPE gpumond_host_memory_used_bytes gauge
gpumond_host_memory_used_bytes 5.8791936e+08
"""


def _read(text: str = GOLDEN, **kw):
    kw.setdefault("fallback_node", "10.0.0.7")
    return read_agent(text_string_to_metric_families(text), t=1000.0, **kw)


def test_signal_tables_cover_exactly_the_shared_signal_names() -> None:
    assert tuple(GPU_SERIES) == GPU_SIGNALS
    assert tuple(HOST_SERIES) == HOST_SIGNALS


def test_golden_exposition_maps_every_gpu_by_uuid() -> None:
    r = _read()
    assert [(g.uuid, g.gpu, g.node, g.up, g.t) for g in r.gpus] == [
        (U0, "0", "gpu-node-07", True, 1000.0),
        (U1, "1", "gpu-node-07", True, 1000.0),
        (U2, "2", "gpu-node-07", False, 1000.0),
    ]
    assert r.node == r.hostname == "gpu-node-07"


def test_values_are_keyed_by_signal_in_base_units() -> None:
    g0 = _read().gpus[0]
    assert dict(g0.values) == {
        "sm_clock_hz": 1.755e9, "sm_clock_max_hz": 1.98e9, "power_w": 662.24, "power_limit_w": 700.0,
        "utilization": 0.94, "temperature_c": 72.0, "throttle_hw_thermal": 0.0, "throttle_sw_thermal": 0.0,
        "throttle_hw_slowdown": 0.0, "throttle_sw_power_cap": 1.0, "throttle_hw_power_brake": 0.0,
        "energy_j": 3312.168,
    }
    assert g0.jobs == ("eval-7", "llama-70b-r3")


def test_a_signal_absent_from_the_exposition_stays_absent() -> None:
    g1 = _read().gpus[1]
    assert "temperature_c" not in g1.values and "sm_clock_max_hz" not in g1.values
    assert g1.values["throttle_hw_thermal"] == 1.0 and g1.jobs == ()


def test_a_lost_gpu_is_down_with_no_values() -> None:
    g2 = _read().gpus[2]
    assert (g2.up, dict(g2.values), g2.jobs) == (False, {}, ())


def test_host_evidence_comes_from_gpumond_host_series() -> None:
    host = _read().host
    assert host is not None and (host.node, host.t) == ("gpu-node-07", 1000.0)
    assert dict(host.values) == {"cpu_utilization": 0.295, "cpu_iowait": 0.125,
                                 "disk_read_bytes_total": 1.547396096e9, "memory_used_bytes": 5.8791936e8}


def test_node_name_prefers_the_operator_then_the_agent_then_the_target_host() -> None:
    assert _read(node="rack3-n7").node == "rack3-n7"
    assert {g.node for g in _read(node="rack3-n7").gpus} == {"rack3-n7"}
    no_info = "\n".join(line for line in GOLDEN.splitlines() if "gpu_info" not in line) + "\n"
    r = _read(no_info)
    assert (r.node, r.hostname) == ("10.0.0.7", None)
    assert {g.node for g in r.gpus} == {"10.0.0.7"}


def test_counter_without_type_line_still_maps() -> None:
    # Untyped families keep `_total` in the family name; typed counters lose it. Both must map.
    r = _read(f'gpumond_gpu_up{{gpu="0",uuid="{U0}"}} 1\ngpumond_host_disk_read_bytes_total 42\n')
    assert r.host is not None and r.host.values == {"disk_read_bytes_total": 42.0}
    assert [(g.uuid, g.up, dict(g.values)) for g in r.gpus] == [(U0, True, {})]


def test_missing_gpu_up_means_not_up_and_nan_is_absent() -> None:
    text = (f'gpumond_gpu_info{{gpu="0",hostname="n",uuid="{U0}"}} 1\n'
            f'gpumond_gpu_power_watts{{gpu="0",uuid="{U0}"}} NaN\n'
            f'gpumond_gpu_temperature_celsius{{gpu="0",uuid="{U0}"}} +Inf\n'
            f'gpumond_gpu_sm_clock_hertz{{gpu="0",uuid="{U0}"}} 1e9\n'
            'gpumond_host_cpu_iowait_ratio NaN\n')
    r = _read(text)
    assert [(g.up, dict(g.values)) for g in r.gpus] == [(False, {"sm_clock_hz": 1e9})]
    assert r.host is None


def test_series_without_uuid_and_foreign_metrics_are_ignored() -> None:
    text = ('gpumond_gpu_power_watts{gpu="0"} 100\n'
            'node_cpu_seconds_total{cpu="0",mode="idle"} 5\n'
            'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-x"} 300\n')
    r = _read(text)
    assert (r.gpus, r.host) == ((), None)


def test_gpu_order_is_numeric() -> None:
    text = "".join(f'gpumond_gpu_up{{gpu="{i}",uuid="GPU-{i:02d}"}} 1\n' for i in (10, 2, 1, 0))
    assert [g.gpu for g in _read(text).gpus] == ["0", "1", "2", "10"]


@pytest.mark.parametrize("reason", ["gpu_idle", "sync_boost", "display_clock_setting"])
def test_unmapped_throttle_reasons_are_not_signals(reason: str) -> None:
    r = _read(f'gpumond_gpu_clocks_event_active{{gpu="0",reason="{reason}",uuid="{U0}"}} 1\n')
    assert dict(r.gpus[0].values) == {}
