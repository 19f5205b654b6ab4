"""Scraped agents' firing alerts reach the telemetry batch (what fleet remediation reads)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gpumond.rules.telemetry.mapping import read_agent
from gpumond.rules.telemetry.scrape import wanted_lines

EXPOSITION = """\
# HELP gpumond_alert_active 1 for each alert the daemon has firing.
# TYPE gpumond_alert_active gauge
gpumond_alert_active{alertname="GpuXidCritical",severity="critical",node="n1",gpu="3",uuid="GPU-a",xid="79"} 1
gpumond_alert_active{alertname="GpuLost",severity="critical",node="n1",gpu="2",uuid="GPU-b",xid=""} 0
gpumond_gpu_up{gpu="3",uuid="GPU-a"} 0
gpumond_gpu_info{gpu="3",uuid="GPU-a",hostname="n1-host"} 1
"""


def test_firing_alerts_are_read_with_the_agents_node_name() -> None:
    families = text_string_to_metric_families(wanted_lines(EXPOSITION))
    reading = read_agent(families, t=1.0, fallback_node="10.0.0.1", node="n1")
    (alert,) = reading.alerts
    assert alert.node == "n1" and alert.label("alertname") == "GpuXidCritical" and alert.label("xid") == "79"
    assert [g.up for g in reading.gpus] == [False]
