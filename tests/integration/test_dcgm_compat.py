"""With `exposition.dcgm_compat` on, a real Prometheus scraping the agent answers dcgm-exporter's dashboards.

The queries are those of dcgm-exporter's own Grafana dashboard, in both generations: the one on grafana.com
(12239: `instance` / `gpu` variables from `label_values(DCGM_FI_DEV_GPU_TEMP, …)`) and the one on its main
branch (`Hostname` / `gpu` variables from `DCGM_FI_DEV_FB_FREE`, `max(…) by (Hostname, gpu, …)`), with their
DCGM_FI_PROF_* panels (tensor and graphics-engine activity), which the agent serves from NVML's GPM on the
simulated H100s (docs/migrating-from-dcgm-exporter.md). Each must return one series per GPU, in dcgm-exporter's
units, equal to gpumond's own series from the same read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.integration.grafana_queries import interpolate, query_range, variable_values
from tests.integration.helpers import (DCGM_NAMING_LINT, AgentProcess, PrometheusServer, promtool_check_metrics, scalar,
                                       write_yaml)

pytestmark = pytest.mark.integration

GPUS = 4
XID_GPU, XID_CODE = "1", 48
WAIT_S = 30.0

# grafana.com dashboard 12239 (dcgm-exporter's, legacy panels), with its two variables.
CLASSIC_VARIABLES = {"instance": "label_values(DCGM_FI_DEV_GPU_TEMP, instance)",
                     "gpu": "label_values(DCGM_FI_DEV_GPU_TEMP, gpu)"}
CLASSIC_PANELS = {
    "GPU Temperature": 'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Power Usage": 'DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}',
    "GPU SM Clocks": 'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000',
    "GPU Utilization": 'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Framebuffer Mem Used": 'DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}',
    # The profiling panel: its metric under the dashboard's filters.
    "Tensor Core Utilization": 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}',
}
# dcgm-exporter's grafana/dcgm-exporter-dashboard.json on its main branch.
CURRENT_VARIABLES = {"Hostname": "label_values(DCGM_FI_DEV_FB_FREE, Hostname)",
                     "gpu": 'label_values(DCGM_FI_DEV_FB_FREE{Hostname=~"$Hostname"}, gpu)'}
CURRENT_PANELS = {
    "GPU Temperature": 'max(DCGM_FI_DEV_GPU_TEMP{Hostname=~"$Hostname", gpu=~"$gpu"}) by (Hostname, gpu, uuid)',
    "GPU Power Usage": 'max(DCGM_FI_DEV_POWER_USAGE{Hostname=~"$Hostname", gpu=~"$gpu"}) by (Hostname, gpu, uuid)',
    "GPU SM Clocks": 'max(DCGM_FI_DEV_SM_CLOCK{Hostname=~"$Hostname", gpu=~"$gpu"} * 1000000) by (Hostname, UUID, gpu)',
    "GPU Framebuffer Mem Used": 'max(DCGM_FI_DEV_FB_USED{Hostname=~"$Hostname", gpu=~"$gpu"}) '
                                'by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)',
    # The profiling panels: their metrics under the dashboard's filters and grouping.
    "GPU Utilization": 'max(DCGM_FI_PROF_GR_ENGINE_ACTIVE{Hostname=~"$Hostname", gpu=~"$gpu"}) by (Hostname, gpu, UUID)',
    "Tensor Core Utilization": 'max(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname=~"$Hostname", gpu=~"$gpu"}) '
                               'by (Hostname, gpu, UUID)',
}
# The same read under both names: DCGM value × factor == gpumond value (same scrape, same sample).
SAME_READ = {
    "DCGM_FI_DEV_GPU_TEMP": ("gpumond_gpu_temperature_celsius", 1),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gpumond_gpu_memory_temperature_celsius", 1),
    "DCGM_FI_DEV_POWER_USAGE": ("gpumond_gpu_power_watts", 1),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("gpumond_gpu_energy_joules_total", 1e-3),
    "DCGM_FI_DEV_SM_CLOCK": ("gpumond_gpu_sm_clock_hertz", 1e6),
    "DCGM_FI_DEV_MEM_CLOCK": ("gpumond_gpu_memory_clock_hertz", 1e6),
    "DCGM_FI_DEV_GPU_UTIL": ("gpumond_gpu_utilization_ratio", 1e-2),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gpumond_gpu_memory_utilization_ratio", 1e-2),
    "DCGM_FI_DEV_FB_USED": ("gpumond_gpu_memory_used_bytes", 1048576),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("gpumond_gpu_pcie_replay_errors_total", 1),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gpumond_gpu_row_remap_failed", 1),
    "DCGM_FI_PROF_SM_ACTIVE": ("gpumond_gpu_sm_active_ratio", 1),  # GPM, both as ratios
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gpumond_gpu_dram_active_ratio", 1),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gpumond_gpu_graphics_engine_active_ratio", 1),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ('gpumond_gpu_nvlink_errors_total{type="replay"}', 1),
}


@dataclass
class Rig:
    agent: AgentProcess
    prom: PrometheusServer


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    work = tmp_path_factory.mktemp("dcgm")
    scenario = write_yaml(work / "scenario.yaml",
                          {"faults": [{"gpu": int(XID_GPU), "kind": "xid", "code": XID_CODE, "at_s": 1}]})
    config = write_yaml(work / "agent.yaml", {"state_dir": str(work / "state"), "node_name": "gpu-node-07",
                                              "sampling": {"fast_interval_s": 1, "slow_interval_s": 1},
                                              "exposition": {"dcgm_compat": {"enabled": True}}})
    agent = AgentProcess(["--sim", str(GPUS), "--sim-scenario", scenario, "--config", config], work / "agent")
    prom = PrometheusServer([agent.address], work / "prometheus")
    try:
        prom.start()
        agent.start()
        prom.wait_for("count(DCGM_FI_DEV_GPU_TEMP)", lambda r: scalar(r) == GPUS, timeout=WAIT_S,
                      what=f"Prometheus to store DCGM_FI_DEV_GPU_TEMP for {GPUS} GPUs")
        yield Rig(agent, prom)
    finally:
        for proc in (prom, agent):
            if proc.proc is not None:
                proc.stop()


@pytest.mark.parametrize("variables,panels", [(CLASSIC_VARIABLES, CLASSIC_PANELS),
                                              (CURRENT_VARIABLES, CURRENT_PANELS)], ids=["grafana.com-12239", "main"])
def test_dcgm_exporter_dashboard_queries_answer_one_series_per_gpu(rig: Rig, variables, panels) -> None:
    chosen: dict[str, list[str]] = {}
    for name, query in variables.items():  # in dashboard order: later variables may use earlier ones
        chosen[name] = variable_values(rig.prom, interpolate(query, chosen))
    assert chosen["gpu"] == [str(i) for i in range(GPUS)], chosen
    assert chosen.get("instance", [rig.agent.address]) == [rig.agent.address], chosen
    assert chosen.get("Hostname", ["gpu-node-07"]) == ["gpu-node-07"], chosen
    for title, expr in panels.items():
        result = query_range(rig.prom, interpolate(expr, chosen), window_s=20)
        assert sorted(r["metric"]["gpu"] for r in result) == chosen["gpu"], f"{title}: {expr} → {result}"
        assert all(r["values"] for r in result), f"{title}: a series without samples: {result}"


def test_values_are_in_dcgm_exporters_units_and_equal_gpumonds_own(rig: Rig) -> None:
    for dcgm, (ours, factor) in SAME_READ.items():
        expr = f"{dcgm} * {factor} - on(instance, gpu) {ours}"
        diffs = rig.prom.query(expr)
        assert len(diffs) == GPUS, f"{expr} → {diffs}"
        assert all(abs(float(r["value"][1])) < 1e-6 for r in diffs), f"{expr} → {diffs}"
    temps = [float(r["value"][1]) for r in rig.prom.query("DCGM_FI_DEV_GPU_TEMP")]
    assert all(20 <= t <= 100 for t in temps), temps  # °C
    clocks = [float(r["value"][1]) for r in rig.prom.query("DCGM_FI_DEV_SM_CLOCK")]
    assert all(100 <= c <= 3000 for c in clocks), clocks  # MHz
    util = [float(r["value"][1]) for r in rig.prom.query("DCGM_FI_DEV_GPU_UTIL")]
    assert all(0 <= u <= 100 for u in util) and max(util) > 1, util  # %, not a ratio


def test_labels_and_the_last_xid_are_dcgm_exporters(rig: Rig) -> None:
    xids = rig.prom.wait_for(f"DCGM_FI_DEV_XID_ERRORS == {XID_CODE}", timeout=WAIT_S,
                             what=f"DCGM_FI_DEV_XID_ERRORS to show XID {XID_CODE} on GPU {XID_GPU}")
    assert [r["metric"]["gpu"] for r in xids] == [XID_GPU]
    zero = rig.prom.query("DCGM_FI_DEV_XID_ERRORS == 0")
    assert sorted(r["metric"]["gpu"] for r in zero) == sorted({str(i) for i in range(GPUS)} - {XID_GPU})
    info = {r["metric"]["gpu"]: r["metric"] for r in rig.prom.query("gpumond_gpu_info")}
    for r in rig.prom.query("DCGM_FI_DEV_POWER_USAGE"):
        m, ours = r["metric"], info[r["metric"]["gpu"]]
        assert (m["UUID"], m["pci_bus_id"], m["modelName"], m["Hostname"]) == (
            ours["uuid"], ours["pci_bus_id"], ours["name"], "gpu-node-07"), m
        assert m["device"] == f"nvidia{m['gpu']}" and m["DCGM_FI_DRIVER_VERSION"], m


def test_promtool_finds_nothing_but_dcgm_exporters_own_naming(rig: Rig) -> None:
    rc, output = promtool_check_metrics(rig.agent.metrics_text())
    findings = output.strip().splitlines()
    assert findings, "expected promtool's notes on dcgm-exporter's camelCase labels"
    unexpected = [line for line in findings if not DCGM_NAMING_LINT.match(line)]
    assert unexpected == [], f"promtool check metrics (exit {rc}) flags more than dcgm-exporter's names:\n{output}"
