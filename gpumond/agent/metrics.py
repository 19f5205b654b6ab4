"""Type and help of every metric the agent exports that is not an NVML catalogue field."""

from __future__ import annotations

from collections.abc import Mapping

from gpumond.agent.relay.stats import RELAY_METRICS
from gpumond.alerts.pipeline import ALERT_METRICS
from gpumond.alerts.sinks import SINK_METRICS
from gpumond.web.connections import CONNECTION_METRICS
from gpumond.nvml.catalogue import CATALOGUE, LINK_CATALOGUE
from gpumond.web.tls import TLS_METRICS

# name → (type, help)
AGENT_METRICS: Mapping[str, tuple[str, str]] = {
    "gpumond_gpu_info": ("gauge", "Identity of each GPU; always 1."),
    "gpumond_gpu_up": ("gauge", "1 when the GPU answered NVML this cycle, 0 when lost or failing."),
    "gpumond_gpu_xid_errors_total": ("counter", "XID critical-error events since the agent started, by XID code."),
    "gpumond_gpu_job_info": ("gauge", "1 for each job found running on the GPU or MIG device (pod, namespace, "
                                      "container when the kubelet assigned it)."),
    "gpumond_gpu_mig_info": ("gauge", "Each MIG device of a MIG-enabled GPU, with its parent GPU; always 1."),
    "gpumond_gpu_mig_memory_used_bytes": ("gauge", "Framebuffer memory used in the MIG device."),
    "gpumond_gpu_mig_memory_total_bytes": ("gauge", "Framebuffer memory of the MIG device."),
    "gpumond_gpu_mig_sm_active_ratio": ("gauge", "Fraction of the MIG device's SMs busy over the interval (GPM, "
                                                 "Hopper and later)."),
    "gpumond_gpu_mig_sm_occupancy_ratio": ("gauge", "Resident warps over the maximum in the MIG device (GPM)."),
    "gpumond_gpu_mig_tensor_active_ratio": ("gauge", "Fraction of the interval the MIG device's tensor pipes were "
                                                     "active, any precision (GPM)."),
    "gpumond_gpu_mig_dram_active_ratio": ("gauge", "Memory bandwidth the MIG device used over the interval (GPM)."),
    "gpumond_nvml_up": ("gauge", "1 while the NVML library is initialised and usable."),
    "gpumond_nvml_errors_total": ("counter", "Failed NVML calls that were retried (Unknown, Timeout, ...)."),
    "gpumond_host_cpu_utilization_ratio": ("gauge", "Host CPU busy fraction (not idle, not iowait) since the last sample."),
    "gpumond_host_cpu_iowait_ratio": ("gauge", "Host CPU fraction spent waiting on I/O since the last sample."),
    "gpumond_host_memory_used_bytes": ("gauge", "Host memory in use (total minus available)."),
    "gpumond_host_disk_read_bytes_total": ("counter", "Bytes read from whole physical disks."),
    "gpumond_collector_success": ("gauge", "1 when the collector's last run succeeded."),
    "gpumond_collector_duration_seconds": ("gauge", "Duration of the collector's last run."),
    "gpumond_build_info": ("gauge", "Build of the running agent; always 1."),
    "gpumond_policy_power_limit_target_watts": ("gauge", (
        "Power limit the policy wants for the GPU now (enforce and dry_run; absent in off and for GPUs not "
        "readable).")),
    "gpumond_policy_temperature_target_celsius": ("gauge", "Temperature the thermal policy holds the GPU under "
                                                           "(configured, else its slowdown threshold minus the margin)."),
    "gpumond_policy_actions_total": ("counter", "Policy actions by kind (set_limit, reapply, restore, dry_run, "
                                                "no_permission, set_failed, restore_failed, not_recorded: a change "
                                                "withheld because its record could not be written first; "
                                                "lease_dry_run: a power-slack lease not applied in dry run)."),
    "gpumond_policy_mode": ("gauge", "The configured policy mode; always 1."),
    "gpumond_policy_record_failing": ("gauge", "1 while the policy cannot write its state file or audit log (file="
                                               "state|audit): no power limit is changed until it can."),
    "gpumond_policy_dry_run_fallback": ("gauge", "1 when the GPU fell back to dry_run (NoPermission on a set)."),
    "gpumond_policy_power_slack_lease_watts": ("gauge", "The power-slack lease's limit on the GPU (dry_run=\"true\": "
                                                        "what it would be; nothing set); absent without a lease."),
    **RELAY_METRICS,
    **CONNECTION_METRICS,
    **TLS_METRICS,
    **ALERT_METRICS,
    **SINK_METRICS,
}


def metric_types() -> dict[str, tuple[str, str]]:
    """Every exported metric name → (type, help), catalogue fields included."""
    out = {f.metric: (f.type, f.help) for f in CATALOGUE + LINK_CATALOGUE}
    out.update(AGENT_METRICS)
    return out
