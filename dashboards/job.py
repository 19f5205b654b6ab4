"""Job: one training job's ranks — step time, data-loader wait, compute and comm-wait shares as the rules
service judged them, the GPUs the ranks run on (joined by GPU UUID), the job's energy, and straggler and
starvation findings as annotations.

The training job's id is the rules service's `job` label, which Prometheus stores as `exported_job` when it
scrapes with the default `honor_labels: false` (its own `job` is the scrape job); the dashboard expects that.
"""

from __future__ import annotations

from grafanalib import core as g

from dashboards.panels import (DATASOURCE, datasource_variable, hide_columns, pos, prometheus_annotation,
                               query_variable, steps, target)

UID = "gpumond-job"
J = 'cluster=~"$cluster", exported_job="$job"'
# 1 per GPU of the job, labelled with its rank and node: multiply a GPU series (uuid → gpu_uuid) by it.
RANKS = f"group by (gpu_uuid, rank, node) (gpumond_job_rank_step_seconds{{{J}}})"


def on_job_gpus(expr: str) -> str:
    """`expr` (an agent series with `uuid`) for the job's GPUs only, labelled with rank and node."""
    return (f'label_replace({expr}, "gpu_uuid", "$1", "uuid", "(.+)") '
            f"* on(gpu_uuid) group_left(rank, node) {RANKS}")


def _series(title: str, unit: str, x: int, y: int, targets: list, width: int = 12, **kw: object) -> g.TimeSeries:
    return g.TimeSeries(title=title, dataSource=DATASOURCE, unit=unit, gridPos=pos(x, y, width, 8), targets=targets,
                        legendDisplayMode="table", legendPlacement="right", legendCalcs=["lastNotNull", "max"],
                        **kw)


def _energy_stat(title: str, unit: str, expr: str, x: int, description: str) -> g.Stat:
    return g.Stat(title=title, description=description, dataSource=DATASOURCE, targets=[target(expr)],
                  gridPos=pos(x, 42, 6, 4), format=unit, graphMode="area", reduceCalc="lastNotNull")


def build() -> g.Dashboard:
    share = {"valueMin": 0, "valueMax": 1}
    panels = [
        _series("Step time by rank", "s", 0, 0, [target(f"gpumond_job_rank_step_seconds{{{J}}}", "rank {{rank}}")],
                description="Median over the detectors' recent window. In synchronous training every rank's "
                            "step equals the slowest one's: this says the job slowed, not who slowed it."),
        _series("Data-loader wait share", "percentunit", 12, 0,
                [target(f"gpumond_job_rank_data_wait_ratio{{{J}}}", "rank {{rank}}")],
                thresholds=steps((None, "green"), (0.2, "orange")), thresholdsStyleMode="line",
                description="Share of each step spent blocked on the data loader; ≥ 20 % is input-bound.", **share),
        # Every share is absolute, 0–1 of the step, as the rules service exports it; per rank they add up to
        # about 1 (medians, so not exactly). The detectors' relative view has its own series and panel.
        _series("Compute share", "percentunit", 0, 8,
                [target(f"gpumond_job_rank_compute_ratio{{{J}}}", "rank {{rank}}")], width=8,
                description="Share of the step neither waiting on data nor on peers (ranks timing comm_wait). "
                            "A straggler computes longest: its share is the highest.", **share),
        _series("Comm wait share", "percentunit", 8, 8,
                [target(f"gpumond_job_rank_comm_wait_ratio{{{J}}}", "rank {{rank}}")], width=8,
                description="Share of the step waiting for peers in collectives (ranks timing comm_wait). "
                            "The slowest rank waits least.", **share),
        _series("Compute share against the step's mean", "percentunit", 16, 8,
                [target(f"gpumond_job_rank_compute_share_deviation{{{J}}}", "rank {{rank}}")], width=8,
                description="What the straggler detector compares: each rank's compute share minus the mean of "
                            "the ranks in the same step (0 for all ranks alike; a straggler stands above)."),
        _series("SM clock of the job's GPUs", "hertz", 0, 16,
                [target(on_job_gpus(f'gpumond_gpu_sm_clock_hertz{{cluster=~"$cluster"}}'), "rank {{rank}}")]),
        _series("Power / enforced limit of the job's GPUs", "percentunit", 12, 16,
                [target(on_job_gpus(f'gpumond_gpu_power_watts{{cluster=~"$cluster"}} '
                                    f'/ gpumond_gpu_power_limit_watts{{cluster=~"$cluster"}}'), "rank {{rank}}")]),
        g.Table(title="The job's GPUs", dataSource=DATASOURCE, gridPos=pos(0, 24, 14, 10),
                description="Each rank's GPU (joined by UUID): temperature, SM clock, utilization, power/limit.",
                targets=[target(on_job_gpus(f'gpumond_gpu_temperature_celsius{{cluster=~"$cluster"}}'), "", "A",
                                instant=True, table=True),
                         target(on_job_gpus(f'gpumond_gpu_sm_clock_hertz{{cluster=~"$cluster"}}'), "", "B",
                                instant=True, table=True),
                         target(on_job_gpus(f'gpumond_gpu_utilization_ratio{{cluster=~"$cluster"}}'), "", "C",
                                instant=True, table=True),
                         target(on_job_gpus(f'gpumond_gpu_power_watts{{cluster=~"$cluster"}} '
                                            f'/ gpumond_gpu_power_limit_watts{{cluster=~"$cluster"}}'), "", "D",
                                instant=True, table=True)],
                transformations=[{"id": "merge", "options": {}}, hide_columns("Time")]),
        g.Table(title="Findings for this job", dataSource=DATASOURCE, gridPos=pos(14, 24, 10, 10),
                targets=[target(f"gpumond_finding{{{J}}}", "", instant=True, table=True)],
                transformations=[hide_columns("Time", "Value", "__name__", "job")]),
        _series("SM activity of the job's GPUs", "percentunit", 0, 34,
                [target(on_job_gpus(f'gpumond_gpu_sm_active_ratio{{cluster=~"$cluster"}}'), "rank {{rank}}")],
                valueMin=0, valueMax=1,
                description="Share of SMs busy on each rank's GPU (GPM, Hopper and later). Ranks waiting for a "
                            "straggler or their data loader do little: their SM activity drops while "
                            "utilization (any kernel, NCCL spinning included) stays high."),
        _series("Tensor activity of the job's GPUs", "percentunit", 12, 34,
                [target(on_job_gpus(f'gpumond_gpu_tensor_active_ratio{{cluster=~"$cluster", precision="any"}}'),
                        "rank {{rank}}")], valueMin=0, valueMax=1),
        # Energy per job: the rules service credits each GPU's energy counter to the jobs on it (docs/rules-api.md).
        _energy_stat("Energy used", "joule", f"gpumond_job_energy_joules_total{{{J}}}", 0,
                     "What the job's GPUs used since the rules service first saw the job on them (MIG slices: "
                     "their share of the board), from the GPUs' own energy counters."),
        _energy_stat("Mean power", "watt", f"gpumond_job_power_watts{{{J}}}", 6,
                     "The job's energy over the time it was measured."),
        _energy_stat("Energy per step", "joule", f"gpumond_job_energy_per_step_joules{{{J}}}", 12,
                     "The job's energy over the steps it completed while measured."),
        _series("Power of the job (from its energy)", "watt", 0, 46,
                [target(f"rate(gpumond_job_energy_joules_total{{{J}}}[$__rate_interval])", "{{exported_job}}")],
                width=24, description="The job's energy counter's rate: what all its GPUs draw together."),
    ]
    return g.Dashboard(
        title="gpumond / Job", uid=UID, tags=["gpumond"], timezone="browser", refresh="30s", graphTooltip=1,
        description="A training job's ranks and GPUs, and what the rules service found.",
        time=g.Time("now-1h", "now"),
        templating=g.Templating([
            datasource_variable(),
            query_variable("cluster", "label_values(gpumond_gpu_info, cluster)", label="Cluster", all_value=".*"),
            query_variable("job", 'label_values(gpumond_job_rank_step_seconds{cluster=~"$cluster"}, exported_job)',
                           label="Job", multi=False),
        ]),
        annotations=g.Annotations([
            prometheus_annotation("Stragglers", f'gpumond_finding{{{J}, kind=~"straggler|straggler_node"}}',
                                  "{{kind}}: rank {{rank}}", "red", "{{node}} {{gpu_uuid}}"),
            prometheus_annotation("I/O starvation", f'gpumond_finding{{{J}, kind=~"io_starved_rank|io_starved_job"}}',
                                  "{{kind}}: rank {{rank}}", "orange", "{{node}} {{gpu_uuid}}"),
        ]),
        panels=panels,
    ).auto_panel_ids()
