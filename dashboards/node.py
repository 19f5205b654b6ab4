"""Node: every GPU on one node — temperature against its policy target and slowdown threshold, power against
its limit and the policy's target, clocks, utilization, memory, clock-event reasons, policy actions as
annotations, and the host evidence (CPU, iowait, disk) that tells a starved node from a starved job."""

from __future__ import annotations

from grafanalib import core as g

from dashboards.panels import (BENIGN_REASONS, DATASOURCE, constant_variable, datasource_variable,
                               hide_columns, pos, prometheus_annotation, query_variable, runbook_links, steps, target)
from gpumond.alerts.catalogue import DEFAULT_RUNBOOK_BASE

UID = "gpumond-node"
HOST = 'cluster=~"$cluster", instance=~"$instance"'
GPU = HOST + ', gpu=~"$gpu"'


def _series(title: str, unit: str, x: int, y: int, targets: list, **kw: object) -> g.TimeSeries:
    return g.TimeSeries(title=title, dataSource=DATASOURCE, unit=unit, gridPos=pos(x, y, 12, 8), targets=targets,
                        legendDisplayMode="table", legendPlacement="right", legendCalcs=["lastNotNull", "max"],
                        **kw)


def build() -> g.Dashboard:
    panels = [
        g.Stat(title="GPUs", dataSource=DATASOURCE, gridPos=pos(0, 0, 24, 3), graphMode="none",
               reduceCalc="lastNotNull", colorMode="background", targets=[target(f"gpumond_gpu_up{{{GPU}}}",
                                                                               "GPU {{gpu}}")],
               thresholds=steps((None, "red"), (1, "green")),
               mappings=[{"type": "value", "options": {"0": {"text": "LOST", "color": "red"},
                                                       "1": {"text": "up", "color": "green"}}}]),
        _series("Temperature against policy target and slowdown", "celsius", 0, 3, [
            target(f"gpumond_gpu_temperature_celsius{{{GPU}}}", "GPU {{gpu}}", "A"),
            target(f"gpumond_policy_temperature_target_celsius{{{GPU}}}", "GPU {{gpu}} policy target", "B"),
            target(f'gpumond_gpu_temperature_threshold_celsius{{{GPU}, threshold="sw_slowdown"}}',
                   "GPU {{gpu}} slowdown", "C")]),
        _series("Power against limit and policy target", "watt", 12, 3, [
            target(f"gpumond_gpu_power_watts{{{GPU}}}", "GPU {{gpu}}", "A"),
            target(f"gpumond_gpu_power_limit_watts{{{GPU}}}", "GPU {{gpu}} enforced limit", "B"),
            target(f"gpumond_policy_power_limit_target_watts{{{GPU}}}", "GPU {{gpu}} policy target", "C")]),
        _series("SM clock", "hertz", 0, 11, [
            target(f"gpumond_gpu_sm_clock_hertz{{{GPU}}}", "GPU {{gpu}}", "A"),
            target(f"max(gpumond_gpu_sm_clock_max_hertz{{{GPU}}})", "board maximum", "B")]),
        _series("Utilization", "percentunit", 12, 11, [
            target(f"gpumond_gpu_utilization_ratio{{{GPU}}}", "GPU {{gpu}}", "A"),
            target(f"gpumond_gpu_memory_utilization_ratio{{{GPU}}}", "GPU {{gpu}} memory", "B")],
                valueMin=0, valueMax=1),
        _series("Device memory used", "bytes", 0, 19, [
            target(f"gpumond_gpu_memory_used_bytes{{{GPU}}}", "GPU {{gpu}}", "A"),
            target(f"max(gpumond_gpu_memory_total_bytes{{{GPU}}})", "installed", "B")]),
        g.StateTimeline(title="Clock-event (throttle) reasons", dataSource=DATASOURCE, gridPos=pos(12, 19, 12, 8),
                        targets=[target(f'gpumond_gpu_clocks_event_active{{{GPU}, reason!~"{BENIGN_REASONS}"}} == 1',
                                        "GPU {{gpu}} {{reason}}")],
                        thresholds=steps((None, "orange")),
                        mappings=[{"type": "value", "options": {"1": {"text": "active", "color": "orange"}}}]),
        _series("Host CPU busy and iowait", "percentunit", 0, 27, [
            target(f"gpumond_host_cpu_utilization_ratio{{{HOST}}}", "CPU busy", "A"),
            target(f"gpumond_host_cpu_iowait_ratio{{{HOST}}}", "iowait", "B")], valueMin=0, valueMax=1),
        _series("Host disk reads and memory", "bytes", 12, 27, [
            target(f"rate(gpumond_host_disk_read_bytes_total{{{HOST}}}[$__rate_interval])", "disk reads / s", "A"),
            target(f"gpumond_host_memory_used_bytes{{{HOST}}}", "memory used", "B")]),
        g.Table(title="Alerts firing on this node", dataSource=DATASOURCE, gridPos=pos(0, 35, 24, 7),
                description="Click a row for the alert's runbook.",
                targets=[target(f"gpumond_alert_active{{{HOST}}}", "", instant=True, table=True)],
                transformations=[hide_columns("Time", "Value", "__name__", "job")],
                extraJson={"fieldConfig": {"defaults": {"links": runbook_links()}}}),
        # GPM (Hopper and later): what the SMs, tensor pipes and memory really do; then NVLink.
        _series("SM and tensor activity", "percentunit", 0, 42, [
            target(f"gpumond_gpu_sm_active_ratio{{{GPU}}}", "GPU {{gpu}} SM", "A"),
            target(f'gpumond_gpu_tensor_active_ratio{{{GPU}, precision="any"}}', "GPU {{gpu}} tensor", "B")],
                valueMin=0, valueMax=1,
                description="Share of SMs busy and of time the tensor pipes ran (GPM). Far below utilization: "
                            "the GPU is busy doing little."),
        _series("DRAM bandwidth and SM occupancy", "percentunit", 12, 42, [
            target(f"gpumond_gpu_dram_active_ratio{{{GPU}}}", "GPU {{gpu}} DRAM", "A"),
            target(f"gpumond_gpu_sm_occupancy_ratio{{{GPU}}}", "GPU {{gpu}} occupancy", "B")], valueMin=0, valueMax=1),
        _series("NVLink and PCIe traffic", "Bps", 0, 50, [
            target(f'gpumond_gpu_nvlink_bytes_per_second{{{GPU}, direction="tx"}}', "GPU {{gpu}} NVLink tx", "A"),
            target(f'gpumond_gpu_pcie_bytes_per_second{{{GPU}, direction="rx"}}', "GPU {{gpu}} PCIe rx", "B")]),
        _series("NVLink errors per second and links down", "none", 12, 50, [
            target(f"sum by (gpu, type) (rate(gpumond_gpu_nvlink_errors_total{{{GPU}}}[$__rate_interval]))",
                   "GPU {{gpu}} {{type}} / s", "A"),
            target(f"sum by (gpu) (1 - gpumond_gpu_nvlink_up{{{GPU}}})", "GPU {{gpu}} links down", "B")],
                description="Replays and CRC errors of all links of each GPU, and its links down; the agent's "
                            "NVLink alerts name the link."),
    ]
    return g.Dashboard(
        title="gpumond / Node", uid=UID, tags=["gpumond"], timezone="browser", refresh="30s", graphTooltip=1,
        description="Every GPU of one node, its policy and its host.", time=g.Time("now-1h", "now"),
        templating=g.Templating([
            datasource_variable(),
            query_variable("cluster", "label_values(gpumond_gpu_info, cluster)", label="Cluster", all_value=".*"),
            query_variable("node", 'label_values(gpumond_gpu_info{cluster=~"$cluster"}, hostname)', label="Node"),
            # The agent's scrape address(es) of the chosen node(s): agent series carry `instance`, not the name.
            query_variable("instance", 'label_values(gpumond_gpu_info{cluster=~"$cluster", hostname=~"$node"}, '
                                       'instance)', label="Agent", hide=2),
            query_variable("gpu", 'label_values(gpumond_gpu_info{cluster=~"$cluster", instance=~"$instance"}, gpu)',
                           label="GPU"),
            constant_variable("runbook_base", DEFAULT_RUNBOOK_BASE),
        ]),
        annotations=g.Annotations([
            # The policy's decisions over time: while it holds a GPU below the board's default limit (a thermal
            # cap or a persistent limit), and each change of the enforced limit. The audit log has the reasons.
            prometheus_annotation("Policy caps", f"gpumond_policy_power_limit_target_watts{{{GPU}}} "
                                                 f"< gpumond_gpu_power_limit_default_watts{{{GPU}}}",
                                  "policy holds GPU {{gpu}} below its default limit", "blue"),
            prometheus_annotation("Limit changes", f"changes(gpumond_gpu_power_limit_watts{{{GPU}}}[1m]) > 0",
                                  "GPU {{gpu}} power limit changed", "purple"),
            prometheus_annotation("Alerts", f"gpumond_alert_active{{{HOST}}}", "{{alertname}}", "red",
                                  "GPU {{gpu}} {{severity}}"),
        ]),
        panels=panels,
    ).auto_panel_ids()
