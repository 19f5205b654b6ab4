"""GPM and NVLink through real pynvml over the simulated libnvidia-ml: series on H100s, none of GPM's on a
model without it, samples freed with a lost GPU, a planted NVLink fault becoming the agent's alerts, each link's
counters only with `exposition.nvlink_per_link`, and dcgm-compat's per-link and per-GPU-instance fields."""

from __future__ import annotations

from gpumond.agent.app import Agent
from gpumond.agent.backends import sim_backend
from gpumond.agent.dcgm import DcgmCompat, dcgm_types
from gpumond.agent.exposition import Renderer
from gpumond.agent.metrics import metric_types
from gpumond.agent.policy.alert_rules import AgentAlertState, agent_conditions
from gpumond.agent.policy.view import build_views
from tests.agent_sampler import node_sampler
from gpumond.config import AgentConfig, PolicyAlertsConfig
from gpumond.nvml.session import NvmlSession
from gpumond.nvml.sim import ManualClock, Scenario, SimulatedNvml
from gpumond.nvml.sim.gpu import SimMigDevice

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
        sampler = node_sampler(session, hostname="n")
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
        sampler = node_sampler(session, hostname="n")
        sampler.fast_cycle()
        clock.advance(1)
        text = sampler.fast_cycle().plain.decode()
        lines = [x for x in text.splitlines() if x.startswith("gpumond_gpu_mig_sm_active_ratio{")]
        assert len(lines) == 2 and any(f'mig_uuid="{busy.uuid}"' in x and float(x.split()[-1]) > 0.5 for x in lines)
    finally:
        session.close()
        assert sim._gpm_samples == {}  # the instances' samples too
        sim.uninstall()


def _values(text: str, metric: str) -> dict[tuple[str, ...], float]:
    """{(gpu, link, type or direction): value} of one metric family in an exposition."""
    out = {}
    for line in text.splitlines():
        if line.startswith(metric + "{"):
            labels = dict(pair.split("=", 1) for pair in line[len(metric) + 1:line.rindex("}")].split(","))
            key = tuple(labels.get(k, '""').strip('"') for k in ("gpu", "link", "type", "direction"))
            out[key] = float(line.rsplit(" ", 1)[1])
    return out


def test_per_link_counters_only_when_asked_each_link_its_own_and_summing_to_the_gpus_totals() -> None:
    sim, clock, session = _setup({"faults": [{"gpu": 0, "kind": "nvlink_degraded", "link": 3, "at_s": 1}]})
    try:
        off = node_sampler(session, hostname="n")
        on = node_sampler(session, hostname="n", nvlink_per_link=True)
        clock.advance(20)
        for s in (off, on):
            s.slow_cycle()
        text_off, text_on = off.fast_cycle().plain.decode(), on.fast_cycle().plain.decode()
        assert "gpumond_gpu_nvlink_link_" not in text_off
        assert _values(text_off, "gpumond_gpu_nvlink_errors_total") == _values(text_on, "gpumond_gpu_nvlink_errors_total")

        errors = _values(text_on, "gpumond_gpu_nvlink_link_errors_total")
        data = _values(text_on, "gpumond_gpu_nvlink_link_data_bytes_total")
        assert len(errors) == 2 * 18 * 4 and len(data) == 2 * 18 * 2  # every link of both H100s
        # the degraded link's replays are on its own link only
        replays = {(gpu, link): v for (gpu, link, kind, _), v in errors.items() if kind == "replay"}
        assert replays[("0", "3")] > 0
        assert all(v == 0 for k, v in replays.items() if k != ("0", "3"))
        # each link's counters sum to the GPU's total of the same read (bytes: KiB × 1024 on both)
        totals = _values(text_on, "gpumond_gpu_nvlink_errors_total")
        for (gpu, _, kind, _), total in totals.items():
            assert sum(v for (g, _, k, _), v in errors.items() if (g, k) == (gpu, kind)) == total
        moved = _values(text_on, "gpumond_gpu_nvlink_data_bytes_total")
        for (gpu, _, _, direction), total in moved.items():
            assert total > 0
            assert sum(v for (g, _, _, d), v in data.items() if (g, d) == (gpu, direction)) == total
    finally:
        session.close()
        sim.uninstall()


def test_per_link_dcgm_fields_and_each_gpu_instances_prof_fields_in_dcgm_compat_mode() -> None:
    sim, clock, session = _setup({"gpus": [{"index": 0, "mig": ["3g.40gb", "1g.10gb"]}],
                                  "faults": [{"gpu": 1, "kind": "nvlink_degraded", "link": 5, "at_s": 1}]})
    try:
        sim.set_mig_processes(0, 0, [4242])  # a job in the 3g instance only
        types = metric_types() | dcgm_types()
        sampler = node_sampler(session, hostname="n", renderer=Renderer(types=types), nvlink_per_link=True,
                          dcgm=DcgmCompat(hostname="n", per_link=True))
        clock.advance(20)
        sampler.slow_cycle()
        sampler.fast_cycle()  # the instances' first GPM samples
        clock.advance(1)
        text = sampler.fast_cycle().plain.decode()
        lines = text.splitlines()

        def dcgm(name: str, gpu: str) -> float:
            (line,) = [x for x in lines if x.startswith(name + "{") and f'gpu="{gpu}"' in x]
            return float(line.rsplit(" ", 1)[1])

        replays = _values(text, "gpumond_gpu_nvlink_link_errors_total")
        assert dcgm("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L5", "1") == replays[("1", "5", "replay", "")] > 0
        assert dcgm("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L4", "1") == 0
        assert not any(x.startswith("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L18") for x in lines)

        busy, idle = session.mig_identities
        sm = [x for x in lines if x.startswith("DCGM_FI_PROF_SM_ACTIVE{") and "GPU_I_ID" in x]
        assert len(sm) == 2  # one per GPU instance of GPU 0; GPU 1 has MIG off
        by_gi = {x.split('GPU_I_ID="')[1].split('"')[0]: x for x in sm}
        ours = {x.split('gpu_instance="')[1].split('"')[0]: float(x.rsplit(" ", 1)[1]) for x in lines
                if x.startswith("gpumond_gpu_mig_sm_active_ratio{")}
        for gi, line in by_gi.items():
            assert f'UUID="{busy.parent_uuid}"' in line and 'gpu="0"' in line
            assert float(line.rsplit(" ", 1)[1]) == ours[gi]  # the same read as gpumond's own series
        assert 'GPU_I_PROFILE="3g.40gb"' in by_gi[str(busy.gpu_instance)]
        assert float(by_gi[str(busy.gpu_instance)].rsplit(" ", 1)[1]) > 0.5
        assert float(by_gi[str(idle.gpu_instance)].rsplit(" ", 1)[1]) == 0.0
        assert not any(x.startswith("DCGM_FI_PROF_PCIE_TX_BYTES{") and "GPU_I_ID" in x for x in lines)
        assert 'gpumond_collector_success{collector="dcgm_compat_mig"} 1.0' in text
    finally:
        session.close()
        sim.uninstall()


def test_the_agent_config_switch_reaches_the_exposition(tmp_path) -> None:
    cfg = AgentConfig.model_validate({"node_name": "n", "state_dir": str(tmp_path),
                                      "exposition": {"nvlink_per_link": True}})
    agent = Agent(cfg, sim_backend(1, None, 1.0, "n"))
    try:
        agent.start()
        rendered = agent.latest()
        assert rendered is not None
        text = rendered.plain.decode()
        assert len(_values(text, "gpumond_gpu_nvlink_link_errors_total")) == 18 * 4
    finally:
        agent.stop()


def test_compute_instances_of_one_gpu_instance_share_its_gpm_sample() -> None:
    sim, clock, session = _setup({"gpus": [{"index": 0, "mig": ["3g.40gb"]}]}, gpus=1)
    try:
        # A second compute instance in the same GPU instance (the scenario makes one per GPU instance): a MIG
        # device of its own, with the GPU instance id of the first.
        gpu = sim._gpus[0]
        first = gpu.mig[0]
        second = SimMigDevice(gpu, 1, first.gpu_instance, first.profile)
        second.compute_instance, second.uuid = 1, first.uuid[:-1] + ("0" if first.uuid[-1] != "0" else "1")
        gpu.mig.append(second)
        sim._mig_by_handle[second.handle] = second
        sim.set_mig_processes(0, 0, [4242])
        assert len(session.discover_mig()) == 2
        assert session.read_mig_gpm() == {}
        clock.advance(1)
        activity = session.read_mig_gpm()
        assert activity[first.uuid]["sm"] > 50
        assert activity[second.uuid] == activity[first.uuid]  # one sample of the instance, not one per device
        assert session.errors_total == {}
    finally:
        session.close()
        sim.uninstall()
