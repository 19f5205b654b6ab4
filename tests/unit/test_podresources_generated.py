"""The committed pod-resources client is exactly what the pinned grpcio-tools generates from api.proto."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("grpc_tools", reason="grpcio-tools regenerates the client; it is in the test extra")

ROOT = Path(__file__).resolve().parents[2]
V1 = ROOT / "gpumond" / "agent" / "podresources" / "v1"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_podresources", ROOT / "scripts" / "gen_podresources.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_client_is_in_step_with_the_proto(tmp_path: Path) -> None:
    written = _generator().generate(tmp_path)
    for path in written:
        committed = V1 / path.name
        assert committed.read_bytes() == path.read_bytes(), (
            f"{committed.relative_to(ROOT)} is stale: run python scripts/gen_podresources.py and commit it")


def test_the_client_calls_the_kubelets_method() -> None:
    """The wire name the kubelet serves: package v1, service PodResourcesLister, method List."""
    from gpumond.agent.podresources.v1 import api_pb2

    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert service.methods_by_name["List"].input_type.full_name == "v1.ListPodResourcesRequest"
    fields = api_pb2.ContainerDevices.DESCRIPTOR.fields_by_name
    assert (fields["resource_name"].number, fields["device_ids"].number) == (1, 2)
