"""Finding this rank's GPU UUID: which device, nvidia-smi in a subprocess, torch only if CUDA is up."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace
from typing import Any

import pytest

from gpumond.job.device import (
    NVIDIA_SMI_TIMEOUT_S,
    device_selector,
    local_gpu_uuid,
    uuid_from_nvidia_smi,
    uuid_from_torch,
)

UUID = "GPU-5b0c1a2e-3f4d-4e5f-8a9b-0c1d2e3f4a5b"
MIG = "MIG-6c1d2b3f-4a5e-4f60-9bac-1d2e3f4a5b6c"
LEGACY_MIG = f"MIG-{UUID}/7/0"


@pytest.mark.parametrize(("env", "selector"), [
    ({}, "0"),
    ({"LOCAL_RANK": "3"}, "3"),
    ({"SLURM_LOCALID": "2"}, "2"),
    ({"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "4,5,6"}, "5"),  # CUDA renumbers the visible ones
    ({"LOCAL_RANK": "3", "CUDA_VISIBLE_DEVICES": "6"}, "6"),  # one GPU per task: that one
    ({"CUDA_VISIBLE_DEVICES": f"{UUID},GPU-other"}, UUID),
    ({"LOCAL_RANK": "2", "CUDA_VISIBLE_DEVICES": "0,-1,2"}, "0"),  # CUDA stops at the invalid entry
    ({"CUDA_VISIBLE_DEVICES": ""}, None),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, None),
    ({"LOCAL_RANK": "x"}, "0"),
    # a container: the NVIDIA runtime's list, UUIDs in CUDA's order (a MIG slice by its MIG UUID)
    ({"NVIDIA_VISIBLE_DEVICES": MIG}, MIG),
    ({"LOCAL_RANK": "1", "NVIDIA_VISIBLE_DEVICES": f"{UUID},{MIG}"}, MIG),
    ({"NVIDIA_VISIBLE_DEVICES": LEGACY_MIG}, LEGACY_MIG),
    ({"LOCAL_RANK": "1", "NVIDIA_VISIBLE_DEVICES": "all"}, "1"),  # not UUIDs: ask the device as before
    ({"CUDA_VISIBLE_DEVICES": "0", "NVIDIA_VISIBLE_DEVICES": MIG}, "0"),  # CUDA's own list wins
])
def test_device_selector(env: dict[str, str], selector: str | None) -> None:
    assert device_selector(env) == selector


class FakeRun:
    """subprocess.run that records its arguments and answers as told."""

    def __init__(self, stdout: str = UUID + "\n", returncode: int = 0, raises: Exception | None = None) -> None:
        self.stdout, self.returncode, self.raises = stdout, returncode, raises
        self.calls: list[tuple[list[str], dict[str, Any]]] = []

    def __call__(self, argv: list[str], **kwargs: Any) -> SimpleNamespace:
        self.calls.append((argv, kwargs))
        if self.raises is not None:
            raise self.raises
        return SimpleNamespace(stdout=self.stdout, returncode=self.returncode)


def test_nvidia_smi_query_for_the_selected_device() -> None:
    run = FakeRun()
    assert uuid_from_nvidia_smi("5", run) == UUID
    argv, kwargs = run.calls[0]
    assert argv == ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", "5"]
    assert kwargs["timeout"] == NVIDIA_SMI_TIMEOUT_S


@pytest.mark.parametrize("run", [
    FakeRun(raises=FileNotFoundError("nvidia-smi")),
    FakeRun(raises=subprocess.TimeoutExpired("nvidia-smi", NVIDIA_SMI_TIMEOUT_S)),
    FakeRun(returncode=6, stdout="No devices were found\n"),
    FakeRun(stdout=""),
    FakeRun(stdout=f"{UUID}\nGPU-second\n"),  # more than one device: not ours to choose
])
def test_nvidia_smi_failures_mean_unknown(run: FakeRun) -> None:
    assert uuid_from_nvidia_smi("0", run) is None


def fake_torch(initialized: bool = True, uuid: str = "5b0c1a2e-3f4d-4e5f-8a9b-0c1d2e3f4a5b",
               count: int = 4, current: int = 0) -> tuple[SimpleNamespace, list[int]]:
    """A `torch` module with just enough of torch.cuda; returns it and the indices asked about."""
    asked: list[int] = []

    def props(i: int) -> SimpleNamespace:
        asked.append(i)
        return SimpleNamespace(uuid=uuid)

    cuda = SimpleNamespace(is_initialized=lambda: initialized, device_count=lambda: count,
                           current_device=lambda: current, get_device_properties=props)
    return SimpleNamespace(cuda=cuda), asked


def test_torch_uuid_gets_the_nvml_prefix_and_the_local_rank_device() -> None:
    torch, asked = fake_torch()
    assert uuid_from_torch({"LOCAL_RANK": "2"}, {"torch": torch}) == UUID  # type: ignore[dict-item]
    assert asked == [2]


def test_torch_falls_back_to_the_current_device_when_local_rank_is_not_visible() -> None:
    torch, asked = fake_torch(count=1, current=0)
    uuid_from_torch({"LOCAL_RANK": "3"}, {"torch": torch})  # type: ignore[dict-item]
    assert asked == [0]


def test_torch_is_not_asked_before_cuda_is_initialised() -> None:
    torch, asked = fake_torch(initialized=False)
    assert uuid_from_torch({}, {"torch": torch}) is None  # type: ignore[dict-item]
    assert asked == []


def test_torch_not_imported_or_broken_means_unknown() -> None:
    assert uuid_from_torch({}, {}) is None
    broken = SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: 1 / 0))
    assert uuid_from_torch({}, {"torch": broken}) is None  # type: ignore[dict-item]


def test_local_lookup_order() -> None:
    torch, _ = fake_torch(uuid="11111111-2222-3333-4444-555555555555")
    run = FakeRun()
    # A full UUID in CUDA_VISIBLE_DEVICES needs nobody's help; nor does a MIG slice the runtime named.
    assert local_gpu_uuid({"CUDA_VISIBLE_DEVICES": UUID}, run=run, modules={"torch": torch}) == UUID
    assert local_gpu_uuid({"NVIDIA_VISIBLE_DEVICES": MIG}, run=run, modules={"torch": torch}) == MIG
    # torch, when CUDA is up, before a subprocess.
    got = local_gpu_uuid({}, run=run, modules={"torch": torch})  # type: ignore[dict-item]
    assert got == "GPU-11111111-2222-3333-4444-555555555555"
    assert run.calls == []
    # Otherwise nvidia-smi.
    assert local_gpu_uuid({}, run=run, modules={}) == UUID
    # No visible GPU: nothing is asked.
    assert local_gpu_uuid({"CUDA_VISIBLE_DEVICES": "-1"}, run=FakeRun(raises=AssertionError()), modules={}) is None


def test_lookup_never_imports_torch() -> None:
    import sys

    before = "torch" in sys.modules
    local_gpu_uuid({}, run=FakeRun(returncode=1))
    assert ("torch" in sys.modules) == before
