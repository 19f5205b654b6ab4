"""MIG on the simulated NVML, read through real pynvml: discovery, per-instance series, what is left out."""

from __future__ import annotations


from tests.agent_sampler import node_sampler
from gpumond.nvml.mig import profile_of
from gpumond.nvml.sim import Scenario
from gpumond.wire.identity import MIG_UUID

MIG = Scenario.model_validate({"gpus": [{"index": 1, "mig": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}]})


def series_of(rendered_results, name):
    return [s for r in rendered_results for s in r.series if s.name == name]


def test_session_finds_each_mig_device(make_session) -> None:
    sim, session, _ = make_session(gpus=2, scenario=MIG)
    found = session.mig_identities
    g1 = sim.gpus[1]
    assert [(m.parent_index, m.parent_uuid, m.uuid, m.gpu_instance, m.compute_instance, m.profile) for m in found] == [
        (1, g1.uuid, d.uuid, d.gpu_instance, 0, d.profile.name) for d in g1.mig]
    assert all(MIG_UUID.fullmatch(m.uuid) for m in found)
    assert [m.profile for m in found] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]


def test_agent_exports_each_instance_and_keeps_per_gpu_series_as_they_were(make_session) -> None:
    sim, session, _ = make_session(gpus=2, scenario=MIG)
    sim.set_mig_processes(1, 0, [4242])
    sampler = node_sampler(session, hostname="n")
    sampler.slow_cycle()
    sampler.fast_cycle()
    results = sampler.last_snapshot.results
    g1 = sim.gpus[1]
    mig_labels = [(("gpu", "1"), ("uuid", g1.uuid), ("mig_uuid", d.uuid), ("gpu_instance", str(d.gpu_instance)),
                   ("compute_instance", "0"), ("profile", d.profile.name)) for d in g1.mig]
    assert [s.labels for s in series_of(results, "gpumond_gpu_mig_info")] == mig_labels
    total = {s.labels: s.value for s in series_of(results, "gpumond_gpu_mig_memory_total_bytes")}
    used = {s.labels: s.value for s in series_of(results, "gpumond_gpu_mig_memory_used_bytes")}
    assert total == {lab: float(d.memory_total_bytes) for lab, d in zip(mig_labels, g1.mig)}
    assert used == {lab: float(d.memory_used_bytes) for lab, d in zip(mig_labels, g1.mig)}
    assert used[mig_labels[0]] > 10 * used[mig_labels[1]]  # the busy instance holds far more than an idle one
    # The per-GPU series keep exactly gpu and uuid (plus their own labels), MIG or not.
    per_gpu = [s for r in results for s in r.series if s.name.startswith("gpumond_gpu_")
               and "mig" not in s.name and dict(s.labels).get("uuid") in (sim.gpus[0].uuid, g1.uuid)]
    assert per_gpu and all(s.labels[:2] == (("gpu", s.labels[0][1]), ("uuid", s.labels[1][1])) for s in per_gpu)
    assert not any("mig_uuid" in dict(s.labels) for s in per_gpu)
    # Board-wide values of the MIG-enabled GPU still come from the parent; utilization is not counted in MIG mode.
    names = {(s.name, dict(s.labels)["gpu"]) for s in per_gpu}
    assert ("gpumond_gpu_temperature_celsius", "1") in names and ("gpumond_gpu_power_watts", "1") in names
    assert ("gpumond_gpu_utilization_ratio", "0") in names and ("gpumond_gpu_utilization_ratio", "1") not in names
    assert {r.source: r.ok for r in results}["nvml_mig"] is True


def test_no_mig_series_without_mig(make_session) -> None:
    sim, session, _ = make_session(gpus=2)
    sampler = node_sampler(session, hostname="n")
    sampler.slow_cycle()
    sampler.fast_cycle()
    assert session.mig_identities == ()
    assert "nvml_mig" not in {r.source for r in sampler.last_snapshot.results}


def test_a_lost_parent_takes_its_instances_with_it(make_session) -> None:
    sim, session, clock = make_session(gpus=2, scenario=MIG)
    sampler = node_sampler(session, hostname="n")
    sampler.slow_cycle()
    sim.inject({"gpu": 1, "kind": "lost"})
    clock.advance(1.0)
    sampler.fast_cycle()
    sampler.fast_cycle()
    results = sampler.last_snapshot.results
    assert series_of(results, "gpumond_gpu_mig_memory_used_bytes") == []
    assert {dict(s.labels)["gpu"]: s.value for s in series_of(results, "gpumond_gpu_up")} == {"0": 1.0, "1": 0.0}


def test_profile_from_the_name_or_the_attributes() -> None:
    assert profile_of("NVIDIA A100-SXM4-40GB MIG 1g.5gb") == "1g.5gb"
    assert profile_of("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me") == "1g.10gb+me"
    assert profile_of("NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb") == "1c.3g.40gb"
    assert profile_of("NVIDIA H100 80GB HBM3", slices=3, memory_mib=40192) == "3g.40gb"
    assert profile_of("") == ""
    assert MIG_UUID.fullmatch("MIG-5b0c1c2d-1111-2222-3333-444455556666")
    assert not MIG_UUID.fullmatch("MIG-5b0c")
