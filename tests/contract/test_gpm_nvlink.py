"""GPM and NVLink through real pynvml over the simulated libnvidia-ml: series on H100s, none of GPM's on a
model without it, samples freed with a lost GPU, and a planted NVLink fault becoming the agent's alerts."""

from __future__ import annotations

from gpumond.agent.policy.alert_rules import AgentAlertState, agent_conditions
from gpumond.agent.policy.view import build_views
from gpumond.agent.sampler import Sampler
from gpumond.config import PolicyAlertsConfig
from gpumond.nvml.session import NvmlSession
from gpumond.nvml.sim import ManualClock, Scenario, SimulatedNvml

GPM_METRICS = ("gpumond_gpu_sm_active_ratio", "gpumond_gpu_sm_occupancy_ratio", "gpumond_gpu_tensor_active_ratio",
               "gpumond_gpu_dram_active_ratio", "gpumond_gpu_pcie_bytes_per_second",
               "gpumond_gpu_nvlink_bytes_per_second")


def _setup(scenario: dict, gpus: int = 2) -> tuple[SimulatedNvml, ManualClock, NvmlSession]:
    clock = ManualClock()
    sim = SimulatedNvml(gpu_count=gpus, clock=clock, scenario=Scenario.model_validate(scenario))
    session = NvmlSession(install=sim.install, clock=clock.now)
    session.open()
    return sim, clock, session


def _series(text: str, metric: str, gpu: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(metric + "{") and f'gpu="{gpu}"' in line]


def test_h100_exports_gpm_and_nvlink_series_and_a_model_without_gpm_none_of_gpms() -> None:
    sim, clock, session = _setup({"gpus": [{"index": 1, "model": "v100-sxm2"}, {"index": 0, "load": {
        "pattern": "constant", "utilization": 1.0}}]})
    try:
        sampler = Sampler(session, hostname="n")
        sampler.fast_cycle()  # first GPM sample: no rates yet
        clock.advance(1)
        text = sampler.fast_cycle().plain.decode()
        for metric in GPM_METRICS:
            assert _series(text, metric, "0"), metric
            assert not _series(text, metric, "1"), metric  # Volta: left out, never 0
        (sm,) = _series(text, "gpumond_gpu_sm_active_ratio", "0")
        assert 0.8 < float(sm.split()[-1]) <= 0.86  # 0.85 × a full load
        assert len(_series(text, "gpumond_gpu_nvlink_up", "0")) == 18
        assert len(_series(text, "gpumond_gpu_nvlink_up", "1")) == 6  # V100 has NVLink, not GPM
        assert "gpumond_nvml_errors_total" not in text
    finally:
        session.close()
        sim.uninstall()


def test_busy_idle_keeps_utilization_and_drops_sm_activity() -> None:
    sim, clock, session = _setup({"default_load": {"pattern": "constant", "utilization": 0.95},
                                  "faults": [{"gpu": 1, "kind": "busy_idle"}]})
    try:
        session.read("fast")
        clock.advance(2)
        read = {g.identity.index: dict(g.values) for g in session.read("fast").gpus}
        assert read[0]["utilization"]["gpu"] == read[1]["utilization"]["gpu"] == 95
        assert read[0]["gpm"]["sm"] > 75 and read[1]["gpm"]["sm"] < 6
    finally:
        session.close()
        sim.uninstall()


def test_a_lost_gpu_frees_its_gpm_samples_and_close_frees_the_rest() -> None:
    sim, clock, session = _setup({})
    try:
        session.read("fast")
        assert len(sim._gpm_samples) == 4  # two per GPU
        sim.inject({"kind": "lost", "gpu": 1})
        clock.advance(1)
        read = session.read("fast")
        assert [g.up for g in read.gpus] == [True, False]
        assert len(sim._gpm_samples) == 2
    finally:
        session.close()
        assert sim._gpm_samples == {}
        sim.uninstall()


def test_a_planted_degraded_and_a_down_nvlink_become_agent_alerts() -> None:
    sim, clock, session = _setup({"faults": [{"gpu": 0, "kind": "nvlink_degraded", "link": 3, "at_s": 5},
                                             {"gpu": 1, "kind": "nvlink_down", "link": 7, "at_s": 5}]})
    cfg, state, fired = PolicyAlertsConfig(), AgentAlertState(), set()
    try:
        slow = session.read("slow")
        for t in range(1, 40):
            clock.advance(1)
            if t % 10 == 0:
                slow = session.read("slow")
            views = build_views(session.read("fast"), slow)
            state, conditions = agent_conditions(views, state, (), "n", cfg, float(t))
            for c in conditions:
                labels = dict(c.labels)
                if "link" in labels:
                    fired.add((labels["alertname"], labels["gpu"], labels["link"], c.for_s))
        assert ("GpuNvLinkErrorsIncreasing", "0", "3", 0.0) in fired
        assert ("GpuNvLinkDown", "1", "7", 10.0) in fired
        assert {f[:3] for f in fired} == {("GpuNvLinkErrorsIncreasing", "0", "3"), ("GpuNvLinkDown", "1", "7")}
    finally:
        session.close()
        sim.uninstall()


def test_each_mig_instance_reports_its_own_activity() -> None:
    sim, clock, session = _setup({"gpus": [{"index": 0, "mig": ["3g.40gb", "1g.10gb"]}]}, gpus=1)
    try:
        sim.set_mig_processes(0, 0, [4242])  # a job in the 3g instance only
        session.discover_mig()
        assert session.read_mig_gpm() == {}  # first samples: no rates yet
        clock.advance(1)
        busy, idle = session.mig_identities
        activity = session.read_mig_gpm()
        assert activity[busy.uuid]["sm"] > 50 and activity[idle.uuid]["sm"] == 0.0
        sampler = Sampler(session, hostname="n")
        sampler.fast_cycle()
        clock.advance(1)
        text = sampler.fast_cycle().plain.decode()
        lines = [x for x in text.splitlines() if x.startswith("gpumond_gpu_mig_sm_active_ratio{")]
        assert len(lines) == 2 and any(f'mig_uuid="{busy.uuid}"' in x and float(x.split()[-1]) > 0.5 for x in lines)
    finally:
        session.close()
        assert sim._gpm_samples == {}  # the instances' samples too
        sim.uninstall()
