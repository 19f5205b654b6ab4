"""Fleet: every GPU of a cluster at a glance — up / lost, heat, power, utilization, throttling, errors,
policy actions, what is firing, and whether the agents themselves are healthy."""

from __future__ import annotations

from grafanalib import core as g

from dashboards.panels import (BENIGN_REASONS, DATASOURCE, BarGauge, Heatmap, constant_variable,
                               datasource_variable, hide_columns, pos, query_variable, runbook_links, steps, target)
from gpumond.alerts.catalogue import DEFAULT_RUNBOOK_BASE

UID = "gpumond-fleet"
C = 'cluster=~"$cluster"'
NAMED = "* on(instance, gpu) group_left(hostname) gpumond_gpu_info"


def _stat(title: str, expr: str, x: int, thresholds: list, unit: str = "none", description: str = "") -> g.Stat:
    return g.Stat(title=title, description=description, dataSource=DATASOURCE, targets=[target(expr)],
                  gridPos=pos(x, 0, 4, 4), format=unit, graphMode="none", reduceCalc="lastNotNull",
                  thresholds=thresholds, colorMode="background")


def _breaker() -> g.Stat:
    stat = _stat("Remediation breaker", f"max(gpumond_remediation_breaker_open{{{C}}}) or vector(0)", 4,
                 steps((None, "green"), (1, "red")),
                 description="Open: the blast-radius guard refused a drain and stopped every remediation action "
                             "(runbook GpumondRemediationHalted).")
    stat.gridPos = pos(4, 53, 4, 7)
    return stat


def build() -> g.Dashboard:
    panels = [
        _stat("GPUs up", f"count(gpumond_gpu_up{{{C}}} == 1) or vector(0)", 0, steps((None, "green"))),
        _stat("GPUs lost or failing", f"count(gpumond_gpu_up{{{C}}} == 0) or vector(0)", 4,
              steps((None, "green"), (1, "red")), description="gpumond_gpu_up 0: the GPU fell off the bus or "
                                                             "NVML fails on it (runbook GpuLost)."),
        _stat("Scrape targets down", f"count(up{{{C}}} == 0) or vector(0)", 8, steps((None, "green"), (1, "red")),
              description="Agents or rules services Prometheus cannot scrape."),
        _stat("Alerts firing", f"count(gpumond_alert_active{{{C}}}) or vector(0)", 12,
              steps((None, "green"), (1, "orange"))),
        _stat("Findings firing", f"count(gpumond_finding{{{C}}}) or vector(0)", 16,
              steps((None, "green"), (1, "orange")), description="Stragglers, starved ranks and jobs, hangs."),
        _stat("Power drawn / enforced limit",
              f"sum(gpumond_gpu_power_watts{{{C}}}) / sum(gpumond_gpu_power_limit_watts{{{C}}})", 20,
              steps((None, "green"), (0.9, "orange")), unit="percentunit"),

        Heatmap(title="GPU temperature across the fleet", dataSource=DATASOURCE, unit="celsius",
                description="Every GPU's die temperature, bucketed at each instant.",
                targets=[target(f"gpumond_gpu_temperature_celsius{{{C}}}", "{{instance}} GPU {{gpu}}")],
                gridPos=pos(0, 4, 12, 9)),
        BarGauge(title="Hottest GPUs", dataSource=DATASOURCE, unit="celsius", min=20, max=100,
                 targets=[target(f"topk(10, gpumond_gpu_temperature_celsius{{{C}}} {NAMED})",
                                 "{{hostname}} GPU {{gpu}}", instant=True)],
                 thresholds=steps((None, "green"), (80, "orange"), (87, "red")), gridPos=pos(12, 4, 6, 9)),
        BarGauge(title="Least headroom to thermal slowdown", dataSource=DATASOURCE, unit="celsius", min=0, max=40,
                 description="Each GPU's own software-slowdown temperature (NVML GPU_MAX) minus its temperature.",
                 targets=[target(f'bottomk(10, (gpumond_gpu_temperature_threshold_celsius{{{C}, threshold="sw_slowdown"}} '
                                 f"- ignoring(threshold) gpumond_gpu_temperature_celsius{{{C}}}) {NAMED})",
                                 "{{hostname}} GPU {{gpu}}", instant=True)],
                 thresholds=steps((None, "red"), (3, "orange"), (8, "green")), gridPos=pos(18, 4, 6, 9)),

        g.TimeSeries(title="Power against limits", dataSource=DATASOURCE, unit="watt", gridPos=pos(0, 13, 12, 8),
                     targets=[target(f"sum(gpumond_gpu_power_watts{{{C}}})", "drawn", "A"),
                              target(f"sum(gpumond_gpu_power_limit_watts{{{C}}})", "enforced limit", "B"),
                              target(f"sum(gpumond_gpu_power_limit_default_watts{{{C}}})", "default limit", "C")]),
        g.TimeSeries(title="GPU utilization", dataSource=DATASOURCE, unit="percentunit", valueMin=0, valueMax=1,
                     description="NVML utilization: any kernel running, NCCL spinning included.",
                     gridPos=pos(12, 13, 12, 8),
                     targets=[target(f"avg(gpumond_gpu_utilization_ratio{{{C}}})", "mean", "A"),
                              target(f"quantile(0.1, gpumond_gpu_utilization_ratio{{{C}}})", "10th percentile", "B"),
                              target(f"min(gpumond_gpu_utilization_ratio{{{C}}})", "lowest", "C")]),

        g.StateTimeline(title="Throttle reasons: GPUs affected", dataSource=DATASOURCE, gridPos=pos(0, 21, 12, 8),
                        targets=[target(f'sum by (reason) (gpumond_gpu_clocks_event_active{{{C}, '
                                        f'reason!~"{BENIGN_REASONS}"}})', "{{reason}}")],
                        thresholds=steps((None, "green"), (1, "orange"), (4, "red"))),
        g.TimeSeries(title="Clock-event time by reason (GPU-seconds per second)", dataSource=DATASOURCE,
                     gridPos=pos(12, 21, 12, 8), unit="none",
                     description="From the driver's own counters: how many GPUs' worth of time each reason held "
                                 "clocks down.",
                     targets=[target(f"sum by (reason) (rate(gpumond_gpu_clocks_event_seconds_total{{{C}}}"
                                     f"[$__rate_interval]))", "{{reason}}")]),

        BarGauge(title="XID errors by code (since each agent started)", dataSource=DATASOURCE, unit="none", min=0,
                 targets=[target(f"sum by (xid) (gpumond_gpu_xid_errors_total{{{C}}})", "XID {{xid}}",
                                 instant=True)],
                 thresholds=steps((None, "orange"), (10, "red")), gridPos=pos(0, 29, 8, 8)),
        g.Table(title="GPUs with memory errors", dataSource=DATASOURCE, gridPos=pos(8, 29, 8, 8),
                targets=[target(f'gpumond_gpu_ecc_errors_total{{{C}, type="uncorrected", scope="volatile"}} > 0',
                                "", "A", instant=True, table=True),
                         target(f"gpumond_gpu_row_remap_pending{{{C}}} > 0", "", "B", instant=True, table=True)],
                transformations=[{"id": "merge", "options": {}}, hide_columns("Time", "job", "scope")]),
        g.TimeSeries(title="Policy actions", dataSource=DATASOURCE, gridPos=pos(16, 29, 8, 8), drawStyle="bars",
                     unit="none",
                     targets=[target(f"sum by (action) (increase(gpumond_policy_actions_total{{{C}}}"
                                     f"[$__rate_interval]))", "{{action}}")]),

        g.Table(title="Alerts firing (agents and rules services)", dataSource=DATASOURCE, gridPos=pos(0, 37, 14, 9),
                description="Click a row for the alert's runbook.",
                targets=[target(f"gpumond_alert_active{{{C}}}", "", instant=True, table=True)],
                transformations=[hide_columns("Time", "Value", "__name__", "job")],
                extraJson={"fieldConfig": {"defaults": {"links": runbook_links()}}}),
        g.Table(title="Current findings", dataSource=DATASOURCE, gridPos=pos(14, 37, 10, 9),
                description="Click a row for the job's dashboard.",
                targets=[target(f"gpumond_finding{{{C}}}", "", instant=True, table=True)],
                transformations=[hide_columns("Time", "Value", "__name__", "job")],
                extraJson={"fieldConfig": {"defaults": {"links": [
                    {"title": "Job ${__data.fields.exported_job}", "url":
                     "/d/gpumond-job?var-job=${__data.fields.exported_job}&${__url_time_range}"}]}}}),

        g.StateTimeline(title="Agent collectors (worst node)", dataSource=DATASOURCE, gridPos=pos(0, 46, 12, 7),
                        targets=[target(f"min by (collector) (gpumond_collector_success{{{C}}})", "{{collector}}")],
                        thresholds=steps((None, "red"), (1, "green")),
                        mappings=[{"type": "value", "options": {"0": {"text": "failing", "color": "red"},
                                                                "1": {"text": "ok", "color": "green"}}}]),
        g.TimeSeries(title="Scrape and collector durations", dataSource=DATASOURCE, unit="s",
                     gridPos=pos(12, 46, 12, 7),
                     targets=[target(f"max(scrape_duration_seconds{{{C}}})", "slowest scrape", "A"),
                              target(f"max by (collector) (gpumond_collector_duration_seconds{{{C}}})",
                                     "{{collector}} (slowest node)", "B")]),

        # Fleet remediation (the rules service): what gpumond took out of service, and whether its guard stopped it.
        g.Stat(title="Nodes drained by gpumond", dataSource=DATASOURCE, gridPos=pos(0, 53, 4, 7),
               description="Nodes the rules service drained or cordoned (dry run: would have); runbook "
                           "GpumondNodeDrained.", graphMode="none", reduceCalc="lastNotNull", colorMode="background",
               targets=[target(f'count(gpumond_remediation_node_drained{{{C}, dry_run="false"}}) or vector(0)',
                               "drained", "A"),
                        target(f'count(gpumond_remediation_node_drained{{{C}, dry_run="true"}}) or vector(0)',
                               "would drain (dry run)", "B")],
               thresholds=steps((None, "green"), (1, "orange"))),
        _breaker(),
        g.Table(title="Nodes drained by gpumond", dataSource=DATASOURCE, gridPos=pos(8, 53, 16, 7),
                description="Why each node is out of service (conditions); dry_run true: not drained, only what "
                            "gpumond would do. Undo one: gpumond remediation undo NODE.",
                targets=[target(f"gpumond_remediation_node_drained{{{C}}}", "", instant=True, table=True)],
                transformations=[hide_columns("Time", "Value", "__name__", "job", "instance")]),

        # What the GPUs really do (GPM, Hopper and later): utilization counts any kernel, SM activity the work.
        Heatmap(title="SM activity across the fleet", dataSource=DATASOURCE, unit="percentunit", scheme="Greens",
                description="Every GPU's share of SMs busy (GPM; Hopper and later), bucketed at each instant. "
                            "A GPU high on utilization but low here is busy doing little (spinning in a "
                            "collective, starved): compare with the utilization panel.",
                targets=[target(f"gpumond_gpu_sm_active_ratio{{{C}}}", "{{instance}} GPU {{gpu}}")],
                gridPos=pos(0, 60, 12, 9)),
        g.TimeSeries(title="Busy but idle: utilization minus SM activity", dataSource=DATASOURCE,
                     unit="percentunit", valueMin=0, valueMax=1, gridPos=pos(12, 60, 6, 9),
                     description="Per GPU, the share of time a kernel ran without the SMs doing work; the "
                                 "highest GPUs of the fleet.",
                     targets=[target(f"topk(5, gpumond_gpu_utilization_ratio{{{C}}} "
                                     f"- on(instance, gpu) gpumond_gpu_sm_active_ratio{{{C}}})",
                                     "{{instance}} GPU {{gpu}}")]),
        g.TimeSeries(title="NVLink: replays per second and links down", dataSource=DATASOURCE, unit="none",
                     gridPos=pos(18, 60, 6, 9),
                     description="A degraded link replays (runbook GpuNvLinkErrorsIncreasing); a link down "
                                 "(GpuNvLinkDown) slows every collective through it.",
                     targets=[target(f'sum(rate(gpumond_gpu_nvlink_errors_total{{{C}, type="replay"}}'
                                     f"[$__rate_interval]))", "replays / s", "A"),
                              target(f"sum(1 - gpumond_gpu_nvlink_up{{{C}}})", "links down", "B")]),
    ]
    return g.Dashboard(
        title="gpumond / Fleet", uid=UID, tags=["gpumond"], timezone="browser", refresh="30s", graphTooltip=1,
        description="Every GPU of a cluster: health, heat, power, throttling, errors, policy, alerts and findings.",
        time=g.Time("now-1h", "now"),
        templating=g.Templating([
            datasource_variable(),
            query_variable("cluster", "label_values(gpumond_gpu_info, cluster)", label="Cluster", all_value=".*"),
            constant_variable("runbook_base", DEFAULT_RUNBOOK_BASE),
        ]),
        annotations=g.Annotations([]),
        panels=panels,
    ).auto_panel_ids()
