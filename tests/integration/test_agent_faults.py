"""Faults injected into the simulated GPUs show up correctly on /metrics and in Prometheus.

One agent (8 simulated GPUs at SPEED× real time, both sampling tiers every simulated second)
runs one scenario with a fault on each of several GPUs, and one Prometheus scrapes it; the
tests below each wait (bounded) for their fault's effect:

  GPU 1: XID 48 and 2 uncorrected ECC errors          GPU 5: energy call NotSupported from the start
  GPU 2: XID 13 twice, at the same instant             GPU 6: a burst of 3 Unknown errors on temperature
  GPU 3: falls off the bus at LOST_AT_S                 GPUs 0, 4, 7: healthy
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.metrics_core import Metric

from tests.integration.helpers import (
    AgentProcess,
    PrometheusServer,
    by_label,
    promtool_check_metrics,
    samples,
    scalar,
    value,
    write_yaml,
)

pytestmark = pytest.mark.integration

GPUS = 8
SPEED = 10.0  # simulated seconds per wall second
ERRORS_AT_S = 30.0  # XIDs, ECC and the Unknown burst (3 s wall after start)
# GPU 3 falls off the bus 12 s (wall) after start: late enough that Prometheus, whose first
# scrape comes ~5 s after it starts (its discovery manager batches updates every 5 s), has
# already stored GPU 3's series, so their disappearance is observable there too.
LOST_AT_S = 120.0
LOST_GPU = "3"
ENERGY_GPU = "5"
UNKNOWN_GPU = "6"
HEALTHY = [str(i) for i in range(GPUS) if str(i) != LOST_GPU]
WAIT_S = 30.0

SCENARIO = {
    "faults": [
        {"gpu": 1, "kind": "xid", "code": 48, "at_s": ERRORS_AT_S},
        {"gpu": 1, "kind": "ecc_uncorrected", "count": 2, "at_s": ERRORS_AT_S},
        {"gpu": 2, "kind": "xid", "code": 13, "at_s": ERRORS_AT_S},
        {"gpu": 2, "kind": "xid", "code": 13, "at_s": ERRORS_AT_S},
        {"gpu": 3, "kind": "lost", "at_s": LOST_AT_S},
        {"gpu": 5, "kind": "nvml_error", "function": "nvmlDeviceGetTotalEnergyConsumption",
         "error": "not_supported", "at_s": 0},
        {"gpu": 6, "kind": "nvml_error", "function": "nvmlDeviceGetTemperatureV", "error": "unknown",
         "count": 3, "at_s": ERRORS_AT_S},
    ],
}
CONFIG = {"sampling": {"fast_interval_s": 1, "slow_interval_s": 1}}


@dataclass
class Rig:
    agent: AgentProcess
    prom: PrometheusServer
    before: dict[str, Metric]  # /metrics right after the agent became healthy
    before_sim_s: float  # an upper bound of the simulated time when `before` was read
    scraped_sim_s: float  # an upper bound of the simulated time of Prometheus's first scrape


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    work = tmp_path_factory.mktemp("faults")
    scenario = write_yaml(work / "scenario.yaml", SCENARIO)
    config = write_yaml(work / "agent.yaml", {**CONFIG, "state_dir": str(work / "state")})
    agent = AgentProcess(["--sim", str(GPUS), "--sim-scenario", scenario, "--sim-speed", str(SPEED),
                          "--config", config], work / "agent")
    prom = PrometheusServer([agent.address], work / "prometheus")
    try:
        prom.start()  # first: its ~5 s until the first scrape overlaps the agent's start
        spawned = time.monotonic()
        agent.start()
        before = agent.metrics()
        before_sim_s = (time.monotonic() - spawned) * SPEED  # the sim clock starts after the spawn
        prom.wait_for('up{job="gpumond"} == 1', timeout=WAIT_S, what="Prometheus's first scrape of the agent")
        scraped_sim_s = (time.monotonic() - spawned) * SPEED
        yield Rig(agent, prom, before, before_sim_s, scraped_sim_s)
    finally:
        for proc in (prom, agent):
            if proc.proc is not None:
                proc.stop()


def _gpus_with(families: dict[str, Metric], name: str) -> dict[str, float]:
    return {s.labels["gpu"]: s.value for s in samples(families, name)}


def test_unsupported_field_is_left_out_on_that_gpu_only(rig: Rig) -> None:
    fams = rig.agent.wait_for_metrics(
        lambda f: set(_gpus_with(f, "gpumond_gpu_energy_joules_total")) >= set(HEALTHY) - {ENERGY_GPU},
        timeout=WAIT_S, what="energy counters on every GPU but the one whose energy call is NotSupported")
    energy = _gpus_with(fams, "gpumond_gpu_energy_joules_total")
    assert ENERGY_GPU not in energy, f"GPU {ENERGY_GPU} must have no energy series (not 0, not NaN): {energy}"
    assert all(math.isfinite(v) and v > 0 for v in energy.values()), energy
    assert f'gpumond_gpu_energy_joules_total{{gpu="{ENERGY_GPU}"' not in rig.agent.metrics_text()
    # Only that field is missing: the GPU itself is up and its other values are there.
    assert value(fams, "gpumond_gpu_up", gpu=ENERGY_GPU) == 1.0
    for name in ("gpumond_gpu_temperature_celsius", "gpumond_gpu_power_watts", "gpumond_gpu_sm_clock_hertz"):
        assert value(fams, name, gpu=ENERGY_GPU) is not None, name
    # ...and it was never there, not even in the first sample.
    assert ENERGY_GPU not in _gpus_with(rig.before, "gpumond_gpu_energy_joules_total")


def test_xid_and_ecc_errors_are_counted(rig: Rig) -> None:
    assert rig.before_sim_s < ERRORS_AT_S, (
        f"the agent took {rig.before_sim_s / SPEED:.1f}s to become healthy, past the moment the errors "
        f"arrive ({ERRORS_AT_S / SPEED:.0f}s): this machine is too slow for the scenario timing")
    assert samples(rig.before, "gpumond_gpu_xid_errors_total") == []
    assert value(rig.before, "gpumond_gpu_ecc_errors_total", gpu="1", type="uncorrected", scope="volatile") == 0
    assert value(rig.before, "gpumond_gpu_row_remap_pending", gpu="1") == 0

    def arrived(f: dict[str, Metric]) -> bool:
        return (value(f, "gpumond_gpu_xid_errors_total", gpu="1", xid="48") is not None
                and (value(f, "gpumond_gpu_xid_errors_total", gpu="2", xid="13") or 0) >= 2
                and (value(f, "gpumond_gpu_ecc_errors_total", gpu="1", type="uncorrected",
                           scope="volatile") or 0) >= 2
                and value(f, "gpumond_gpu_row_remap_pending", gpu="1") == 1.0)

    fams = rig.agent.wait_for_metrics(arrived, timeout=WAIT_S,
                                      what="XID 48 + 2 uncorrected ECC on GPU 1 and 2× XID 13 on GPU 2")
    assert value(fams, "gpumond_gpu_xid_errors_total", gpu="1", xid="48") == 1.0
    assert value(fams, "gpumond_gpu_xid_errors_total", gpu="2", xid="13") == 2.0
    assert value(fams, "gpumond_gpu_ecc_errors_total", gpu="1", type="uncorrected", scope="volatile") >= 2
    assert value(fams, "gpumond_gpu_ecc_errors_total", gpu="1", type="uncorrected", scope="aggregate") >= 2
    assert value(fams, "gpumond_gpu_row_remap_pending", gpu="1") == 1.0
    assert fams["gpumond_gpu_xid_errors"].type == "counter"
    # Nothing leaks onto the other GPUs.
    xids = {(s.labels["gpu"], s.labels["xid"]) for s in samples(fams, "gpumond_gpu_xid_errors_total")}
    assert xids <= {("1", "48"), ("2", "13"), (LOST_GPU, "79")}, xids
    assert value(fams, "gpumond_gpu_ecc_errors_total", gpu="2", type="uncorrected", scope="volatile") == 0.0
    assert value(fams, "gpumond_gpu_row_remap_pending", gpu="2") == 0.0
    # Prometheus reads the same counter.
    rig.prom.wait_for('gpumond_gpu_xid_errors_total{gpu="2",xid="13"}', lambda r: scalar(r) == 2.0,
                      timeout=WAIT_S, what="Prometheus to read gpumond_gpu_xid_errors_total{gpu=2,xid=13} == 2")


def test_unknown_error_burst_is_counted_and_recovered(rig: Rig) -> None:
    key = {"gpu": UNKNOWN_GPU, "call": "nvmlDeviceGetTemperatureV", "error": "unknown"}
    fams = rig.agent.wait_for_metrics(
        lambda f: value(f, "gpumond_nvml_errors_total", **key) == 3.0
        and value(f, "gpumond_gpu_temperature_celsius", gpu=UNKNOWN_GPU) is not None,
        timeout=WAIT_S, what="3 Unknown errors counted for nvmlDeviceGetTemperatureV on GPU 6, then its "
                             "temperature back")
    assert fams["gpumond_nvml_errors"].type == "counter"
    assert value(fams, "gpumond_gpu_up", gpu=UNKNOWN_GPU) == 1.0
    others = [s for s in samples(fams, "gpumond_nvml_errors_total") if s.labels["gpu"] != UNKNOWN_GPU]
    assert others == [], others
    # A burst, not a storm: after more cycles the count is still 3.
    time.sleep(0.5)
    assert value(rig.agent.metrics(), "gpumond_nvml_errors_total", **key) == 3.0


def test_lost_gpu_goes_down_alone_and_its_series_disappear(rig: Rig) -> None:
    assert rig.scraped_sim_s < LOST_AT_S, (
        f"Prometheus first scraped the agent {rig.scraped_sim_s / SPEED:.1f}s after it started, past the "
        f"moment GPU 3 is lost ({LOST_AT_S / SPEED:.0f}s): this machine is too slow for the scenario timing")
    assert value(rig.before, "gpumond_gpu_up", gpu=LOST_GPU) == 1.0
    assert value(rig.before, "gpumond_gpu_temperature_celsius", gpu=LOST_GPU) is not None

    fams = rig.agent.wait_for_metrics(
        lambda f: value(f, "gpumond_gpu_up", gpu=LOST_GPU) == 0.0, timeout=WAIT_S,
        what=f'gpumond_gpu_up{{gpu="{LOST_GPU}"}} == 0')
    up = _gpus_with(fams, "gpumond_gpu_up")
    assert up == {**{g: 1.0 for g in HEALTHY}, LOST_GPU: 0.0}, up
    # Gone, not frozen: no per-GPU value of GPU 3 is exported any more, only its identity and counters.
    for name in ("gpumond_gpu_temperature_celsius", "gpumond_gpu_memory_temperature_celsius",
                 "gpumond_gpu_power_watts", "gpumond_gpu_utilization_ratio"):
        assert value(fams, name, gpu=LOST_GPU) is None, f"{name} of the lost GPU is still exported"
        assert set(_gpus_with(fams, name)) == set(HEALTHY), name
    assert value(fams, "gpumond_gpu_info", gpu=LOST_GPU) == 1.0
    fams = rig.agent.wait_for_metrics(
        lambda f: value(f, "gpumond_gpu_xid_errors_total", gpu=LOST_GPU, xid="79") is not None,
        timeout=WAIT_S, what=f'gpumond_gpu_xid_errors_total{{gpu="{LOST_GPU}",xid="79"}}')
    assert value(fams, "gpumond_gpu_xid_errors_total", gpu=LOST_GPU, xid="79") == 1.0

    # The same through Prometheus.
    rig.prom.wait_for(f'gpumond_gpu_up{{gpu="{LOST_GPU}"}} == 0', timeout=WAIT_S)
    ups = by_label(rig.prom.query("gpumond_gpu_up"), "gpu")
    assert ups == {**{g: 1.0 for g in HEALTHY}, LOST_GPU: 0.0}, ups
    # Prometheus had GPU 3 up with a temperature before the loss...
    seen = rig.prom.query(f'max_over_time(gpumond_gpu_up{{gpu="{LOST_GPU}"}}[5m])')
    assert scalar(seen) == 1.0, seen
    seen = rig.prom.query(f'count_over_time(gpumond_gpu_temperature_celsius{{gpu="{LOST_GPU}"}}[5m])')
    assert (scalar(seen) or 0) >= 1, seen
    # ...and the series went stale at the scrape that lost it: an instant query no longer returns it.
    rig.prom.wait_for(f'gpumond_gpu_temperature_celsius{{gpu="{LOST_GPU}"}}', lambda r: r == [], timeout=5,
                      what="the lost GPU's temperature series to be stale in Prometheus (not frozen)")
    assert scalar(rig.prom.query("count(gpumond_gpu_temperature_celsius)")) == len(HEALTHY)
    rig.prom.wait_for(f'gpumond_gpu_xid_errors_total{{gpu="{LOST_GPU}",xid="79"}}',
                      lambda r: scalar(r) == 1.0, timeout=WAIT_S)


def test_promtool_accepts_the_exposition_with_every_fault_present(rig: Rig) -> None:
    """XID and NVML-error counters, a lost GPU and a missing field all in one exposition (waits for them
    itself, so it holds run alone as well as after the tests above)."""
    rig.agent.wait_for_metrics(
        lambda f: value(f, "gpumond_gpu_up", gpu=LOST_GPU) == 0.0
        and value(f, "gpumond_gpu_xid_errors_total", gpu=LOST_GPU, xid="79") is not None
        and bool(samples(f, "gpumond_nvml_errors_total")),
        timeout=WAIT_S, what=f"GPU {LOST_GPU} lost with its XID 79 counted, and an NVML error counted")
    text = rig.agent.metrics_text()
    for needle in ('gpumond_gpu_xid_errors_total{gpu="3"', "gpumond_nvml_errors_total{", 'gpumond_gpu_up{gpu="3"'):
        assert needle in text, needle
    rc, output = promtool_check_metrics(text)
    assert (rc, output) == (0, ""), f"promtool check metrics exited {rc}:\n{output}"
