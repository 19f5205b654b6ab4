"""Every alert gpumond knows, in one place: its name, who raises it, severity and wording.

One vocabulary for the agent's alerts, the rules service's findings (each finding kind is one
alert), and the alerts that only Prometheus can raise (a dead agent cannot page about itself).
The runbooks (docs/runbooks/<alertname>.md) and deploy/prometheus/ rules are kept in step with
this table by tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Source = Literal["agent", "rules", "prometheus"]

DEFAULT_RUNBOOK_BASE = "https://github.com/gpumond/gpumond/blob/main/docs/runbooks"


@dataclass(frozen=True, slots=True)
class AlertSpec:
    """An alert: who raises it, its severity (None: decided per event, e.g. from the XID table), wording."""

    source: Source
    severity: str | None
    summary: str
    meaning: str
    finding_kind: str | None = None  # for rules-service alerts: the finding kind it reports
    # For remediation alerts: the severity of what dry run only imagined (remediation.dry_run_severity's default).
    dry_run_severity: str | None = None


ALERTS: dict[str, AlertSpec] = {
    # ----- the agent, from NVML on its own node --------------------------------------------------
    "GpuHwThermalSlowdown": AlertSpec(
        "agent", "critical", "hardware thermal slowdown",
        "The GPU reached its hardware slowdown temperature and cut its clocks by half or more."),
    "GpuHwSlowdown": AlertSpec(
        "agent", "critical", "hardware slowdown",
        "Hardware slowdown is engaged without a thermal or power-brake reason, typically power "
        "draw too high for the board."),
    "GpuHwPowerBrakeSlowdown": AlertSpec(
        "agent", "critical", "hardware power-brake slowdown",
        "An external power-brake signal (e.g. from the system power supply) holds the clocks down."),
    "GpuSwThermalSlowdown": AlertSpec(
        "agent", "warning", "software thermal slowdown",
        "The driver lowers clocks to keep the GPU under its maximum operating temperature."),
    "GpuEccUncorrectedIncreasing": AlertSpec(
        "agent", "critical", "uncorrected ECC errors increasing",
        "The GPU reported new uncorrectable memory errors; affected applications got bad data or were stopped."),
    "GpuRowRemapPending": AlertSpec(
        "agent", "warning", "row remap pending",
        "A memory row is marked for remapping; it takes effect at the next GPU reset."),
    "GpuRowRemapFailed": AlertSpec(
        "agent", "critical", "row remapping failed",
        "A row remap failed: the GPU can no longer isolate its bad memory."),
    "GpuXidCritical": AlertSpec(
        "agent", None, "XID error",
        "The driver reported an XID error event (NVML XidCriticalError)."),
    "GpuLost": AlertSpec(
        "agent", "critical", "GPU lost",
        "NVML cannot read this GPU: it fell off the bus, is being reset, or is failing."),
    "GpuPowerCapAtFloor": AlertSpec(
        "agent", "warning", "thermal power cap pinned at its floor",
        "The thermal controller holds the power limit at its floor and the GPU is still above "
        "target: the next stop is hardware slowdown."),
    "GpuNvLinkDown": AlertSpec(
        "agent", "critical", "NVLink down",
        "An NVLink of this GPU that was active is down: traffic to its peer takes the remaining links or "
        "PCIe, and every collective of a job spanning it slows or hangs."),
    "GpuNvLinkErrorsIncreasing": AlertSpec(
        "agent", "warning", "NVLink replays rising",
        "An NVLink of this GPU is replaying (retransmitting) data at a rising rate: a degraded link, cable or "
        "connector that eats bandwidth and slows every collective through it."),
    "GpumondPolicyNotRecorded": AlertSpec(
        "agent", "critical", "power policy cannot record its actions",
        "The agent cannot write its policy state file or audit log in state_dir (disk full, read-only or "
        "permissions). It changes no power limit until it can: a change without a record could not be undone "
        "by a later start. Limits it set before stay restorable."),
    # ----- the rules service: one alert per finding kind --------------------------------------------
    "TrainingStraggler": AlertSpec(
        "rules", "warning", "straggler rank",
        "This rank's GPU is slower than its peers in the same job; in synchronous training every "
        "rank waits for it.", finding_kind="straggler"),
    "TrainingStragglerNode": AlertSpec(
        "rules", "warning", "straggler node",
        "Several GPUs of this node are slower than their peers in the same job: suspect the node "
        "(cooling, power, PCIe, CPU) rather than one GPU.", finding_kind="straggler_node"),
    "TrainingIoStarvedRank": AlertSpec(
        "rules", "warning", "rank starved by its data loader",
        "This rank spends a large share of each step waiting for its data loader while its peers "
        "do not: a local cause (disk, CPU contention, loader workers).", finding_kind="io_starved_rank"),
    "TrainingIoStarvedJob": AlertSpec(
        "rules", "warning", "job starved by its data pipeline",
        "Most ranks of this job wait for their data loaders: the data pipeline or storage cannot "
        "keep up with the GPUs.", finding_kind="io_starved_job"),
    "TrainingJobSlowdown": AlertSpec(
        "rules", "warning", "job slowed down",
        "The job's step time rose well above its own baseline.", finding_kind="job_slowdown"),
    "TrainingRankHung": AlertSpec(
        "rules", "critical", "rank or job hung",
        "A rank (or the whole job) stopped reporting steps while it should be training.",
        finding_kind="hung_rank"),
    # ----- the rules service: fleet remediation (gpumond/rules/remediation) --------------------------
    "GpumondNodeDrained": AlertSpec(
        "rules", "warning", "node drained by gpumond",
        "gpumond took this node out of service (or, in dry run, would have) for a confirmed fault: the "
        "scheduler places no new work on it; it returns by itself once the fault has been clear for the "
        "hold-down."),
    "GpumondRemediationHalted": AlertSpec(
        "rules", "critical", "gpumond remediation stopped by its blast-radius guard",
        "A drain would have exceeded the blast-radius guard (nodes, share of a pool, or drains per hour): "
        "the circuit breaker stopped every remediation action until an operator resets it.",
        dry_run_severity="warning"),
    "GpumondRemediationBackendDown": AlertSpec(
        "rules", "critical", "gpumond remediation cannot reach the scheduler",
        "A drain or return gpumond decided has not been carried out for backend_down_after_s, or the scheduler's "
        "nodes cannot be read: the scheduler's command fails or hangs (slurmctld down, RBAC, the API server). A "
        "node with a confirmed fault may still be taking work.", dry_run_severity="warning"),
    # ----- both daemons: a dead-man's switch -----------------------------------------------------
    "Watchdog": AlertSpec(
        "rules", "info", "gpumond alerting pipeline is alive",
        "Always firing while the sender is alive. Route it to a dead-man's-switch receiver that "
        "pages when it stops arriving."),
    # ----- only Prometheus can see these ---------------------------------------------------------
    "GpumondAgentDown": AlertSpec(
        "prometheus", "critical", "gpumond agent down",
        "Prometheus cannot scrape a gpumond agent: no telemetry, no thermal policy alerts from this node."),
    "GpumondCollectorFailing": AlertSpec(
        "prometheus", "warning", "gpumond collector failing",
        "An agent answers, but one of its sources (NVML, XID events, jobs, host) keeps failing: "
        "some series are stale or missing."),
    "GpumondCertificateExpiring": AlertSpec(
        "prometheus", "warning", "TLS certificate expires soon",
        "The certificate a daemon serves expires within 14 days (or has): its renewal is not reaching it."),
    "GpumondRulesServiceDown": AlertSpec(
        "prometheus", "critical", "gpumond rules service down",
        "Prometheus cannot scrape the rules service: no straggler or starvation findings."),
    "GpumondRulesTelemetryDown": AlertSpec(
        "prometheus", "warning", "rules service has no GPU telemetry",
        "The rules service cannot read GPU telemetry; detectors run on job pushes alone."),
    "GpumondRulesEvaluationFailing": AlertSpec(
        "prometheus", "critical", "rules service evaluations failing",
        "Every evaluation of the rules service raises an error: no finding or alert is raised, updated or "
        "resolved, while the service still answers and accepts pushes."),
    "GpumondAlertSinkFailing": AlertSpec(
        "prometheus", "warning", "gpumond cannot deliver alerts",
        "A gpumond daemon keeps failing to deliver notifications to a sink (Alertmanager, Slack or "
        "PagerDuty), or drops them."),
}

KIND_TO_ALERT: dict[str, str] = {s.finding_kind: name for name, s in ALERTS.items() if s.finding_kind}
FINDING_KINDS: tuple[str, ...] = tuple(KIND_TO_ALERT)


def runbook_url(alertname: str, base: str = DEFAULT_RUNBOOK_BASE) -> str:
    """The runbook page of an alert: `<base>/<alertname>.md`."""
    return f"{base.rstrip('/')}/{alertname}.md"


def alert_for_kind(kind: str) -> str:
    """The alertname of a finding kind; a kind not in the catalogue is a programming error."""
    try:
        return KIND_TO_ALERT[kind]
    except KeyError:
        raise ValueError(f"finding kind {kind!r} has no alert in gpumond.alerts.catalogue") from None
