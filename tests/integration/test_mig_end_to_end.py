"""MIG end to end: an agent process on a simulated MIG-enabled H100 (real pynvml), a kubelet stand-in on a
unix socket naming the pods, and the rules service scraping that agent and accepting pushes from MIG ranks."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

pytest.importorskip("grpc", reason="pod-resources needs the k8s extra (grpcio), installed with .[test]")

from gpumond.config.rules import RulesConfig  # noqa: E402
from gpumond.rules.service import RulesService  # noqa: E402
from tests.integration.helpers import AgentProcess, samples, served, write_yaml  # noqa: E402
from tests.podresources_server import PodResourcesServer, pod  # noqa: E402

pytestmark = pytest.mark.integration

PROFILES = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
TOKEN = "push-token-mig-0123456789"
WAIT_S = 20.0


def push(uuid: str, rank: int) -> dict:
    return {"job": "mig-job", "rank": rank, "world_size": 2, "node": "mig-node", "gpu_uuid": uuid,
            "steps": [{"step": 1, "end": 1_763_760_000.0, "duration_s": 0.5, "data_wait_s": 0.01}]}


def test_mig_instances_pods_and_the_rules_join(tmp_path: Path) -> None:
    scenario = write_yaml(tmp_path / "mig.yaml", {"gpus": [{"index": 1, "mig": PROFILES}]})
    with PodResourcesServer(tmp_path / "kubelet.sock") as kubelet:
        config = write_yaml(tmp_path / "agent.yaml", {
            "sampling": {"slow_interval_s": 1.0},
            "jobs": {"pod_resources": {"enabled": True, "socket": str(kubelet.socket_path), "interval_s": 1.0}},
        })
        with AgentProcess(["--sim", "2", "--sim-scenario", scenario, "--node-name", "mig-node",
                           "--config", config], tmp_path / "agent") as agent:
            info = samples(agent.metrics(), "gpumond_gpu_mig_info")
            assert sorted(s.labels["profile"] for s in info) == sorted(PROFILES)
            parent = info[0].labels["uuid"]
            assert {s.labels["gpu"] for s in info} == {"1"} and {s.labels["uuid"] for s in info} == {parent}
            by_profile = {s.labels["profile"]: s.labels for s in info}
            mig = by_profile["3g.40gb"]
            totals = {s.labels["mig_uuid"]: s.value for s in samples(agent.metrics(),
                                                                     "gpumond_gpu_mig_memory_total_bytes")}
            assert totals[mig["mig_uuid"]] == 40192 * 1024 * 1024

            # The kubelet assigns the 3g.40gb slice to a pod: the next slow cycle names it.
            kubelet.pods = [pod("ml", "trainer-0", ("main", "nvidia.com/mig-3g.40gb", [mig["mig_uuid"]]))]
            families = agent.wait_for_metrics(lambda f: any(
                s.labels.get("pod") == "trainer-0" for s in samples(f, "gpumond_gpu_job_info")),
                timeout=WAIT_S, what="the slice's pod on gpumond_gpu_job_info")
            row = next(s.labels for s in samples(families, "gpumond_gpu_job_info") if s.labels.get("pod"))
            assert row == {**mig, "job": "k8s-pod/ml/trainer-0", "pod": "trainer-0", "namespace": "ml",
                           "container": "main"}

            # The rules service scrapes the agent, takes pushes from MIG ranks in both spellings, and joins
            # each to its instance with the parent GPU's board telemetry.
            rules = RulesService(RulesConfig.model_validate({
                "tokens": [TOKEN], "state_dir": str(tmp_path / "rules"),
                "telemetry": {"scrape": {"targets": [agent.address]}}}))
            try:
                rules.evaluator.poll_telemetry()
                legacy = f"MIG-{parent.upper()}/{mig['gpu_instance']}/{mig['compute_instance']}"
                with served(rules.app) as url, httpx.Client(base_url=url, timeout=5.0) as client:
                    for rank, uuid in enumerate((mig["mig_uuid"], legacy)):
                        r = client.post("/api/v1/push", json=push(uuid, rank),
                                        headers={"Authorization": f"Bearer {TOKEN}"})
                        assert r.status_code == 202, r.text
                ranks = rules.ranks.jobs(1_763_760_000.0)["mig-job"]
                assert ranks[1].info.gpu_uuid == f"MIG-{parent}/{mig['gpu_instance']}/0"  # one spelling
                whole = rules.gpus.window(parent, 0.0)[-1]
                for rank in (0, 1):
                    joined = rules.gpus.window(ranks[rank].info.gpu_uuid, 0.0)
                    assert joined, f"rank {rank} ({ranks[rank].info.gpu_uuid}) has no telemetry"
                    s = joined[-1]
                    assert (s.uuid, s.parent_uuid, s.mig_profile, s.node) == (
                        mig["mig_uuid"], parent, "3g.40gb", "mig-node")
                    assert s.values["temperature_c"] == whole.values["temperature_c"]
                    assert s.values["power_w"] == whole.values["power_w"] and s.up
                    assert "utilization" not in s.values  # not counted in MIG mode: absent, never 0
                    assert s.jobs == ("k8s-pod/ml/trainer-0",)
                assert rules.gpus.window("MIG-" + "0" * 8 + "-0000-4000-8000-" + "0" * 12, 0.0) == ()
                rules.evaluator.evaluate()  # a job on MIG slices evaluates without tripping anything
            finally:
                rules.stop()
