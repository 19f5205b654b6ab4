"""Pure mapping of an agent exposition to GpuSample / HostSample, on a trimmed real exposition."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpumond.rules.telemetry import GPU_SERIES, HOST_SERIES, read_agent
from gpumond.rules.types import GPU_SIGNALS, HOST_SIGNALS
from tests.unit.agent_exposition import GOLDEN, U0, U1, U2


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


def test_gpm_activity_and_nvlink_replays_map_to_their_signals_by_label() -> None:
    u = "GPU-1111"
    text = "\n".join([
        f'gpumond_gpu_info{{gpu="0",uuid="{u}",name="H100",pci_bus_id="0",hostname="n1"}} 1',
        f'gpumond_gpu_up{{gpu="0",uuid="{u}"}} 1',
        f'gpumond_gpu_sm_active_ratio{{gpu="0",uuid="{u}"}} 0.05',
        f'gpumond_gpu_tensor_active_ratio{{gpu="0",precision="hmma",uuid="{u}"}} 0.5',
        f'gpumond_gpu_tensor_active_ratio{{gpu="0",precision="any",uuid="{u}"}} 0.03',
        f'gpumond_gpu_nvlink_errors_total{{gpu="0",type="crc_flit",uuid="{u}"}} 7',
        f'gpumond_gpu_nvlink_errors_total{{gpu="0",type="replay",uuid="{u}"}} 12000',
        ""])
    (g,) = _read(text).gpus
    assert dict(g.values) == {"sm_active": 0.05, "tensor_active": 0.03, "nvlink_replays_total": 12000.0}
