"""The names every part joins on: device UUIDs in all their forms, job ids from the environment."""

from __future__ import annotations

import pytest

from gpumond.wire.identity import (DEVICE_UUID, GPU_UUID, LEGACY_MIG_UUID, MAX_LABEL_CHARS, MIG_UUID,
                              canonical_device_uuid, clean_label, first_env, legacy_mig_uuid)

HEX = "5B0C1C2D-1111-2222-3333-44445555666A"


@pytest.mark.parametrize("value, patterns", [
    (f"GPU-{HEX}", {GPU_UUID, DEVICE_UUID}),
    (f"MIG-{HEX}", {MIG_UUID, DEVICE_UUID}),
    (f"MIG-GPU-{HEX}/3/0", {LEGACY_MIG_UUID, DEVICE_UUID}),
    (f"MIG-GPU-{HEX}/13/10", {LEGACY_MIG_UUID, DEVICE_UUID}),
    (f"MIG-GPU-{HEX}/123/0", set()),  # NVML has at most 7 gpu instances: three digits is not a MIG name
    (f"GPU-{HEX}/3/0", set()),
    ("GPU-5b0c", set()),
    (f"gpu-{HEX}", set()),
])
def test_each_form_matches_exactly_its_patterns(value: str, patterns: set) -> None:
    assert {p for p in (GPU_UUID, MIG_UUID, LEGACY_MIG_UUID, DEVICE_UUID) if p.fullmatch(value)} == patterns


def test_one_spelling_per_device() -> None:
    lower = HEX.lower()
    assert canonical_device_uuid(f"GPU-{HEX}") == f"GPU-{lower}"
    assert canonical_device_uuid(f"MIG-{HEX}") == f"MIG-{lower}"
    assert canonical_device_uuid(f"MIG-GPU-{HEX}/03/00") == f"MIG-GPU-{lower}/3/0"
    assert legacy_mig_uuid(f"GPU-{HEX}", 3, 0) == f"MIG-GPU-{lower}/3/0"


@pytest.mark.parametrize("raw, expected", [
    ("123456", "123456"),
    ("  123456 \n", "123456"),
    ("Llama-70B_r3", "Llama-70B_r3"),  # verbatim: the agent and the SDK report the same string
    ("x" * 500, "x" * MAX_LABEL_CHARS),
    (7, "7"),
    ("job\x00id", None), ("job\x1bid", None), ("job\x7fid", None), ("job\x85id", None),
    ("job\u202eid", None), ("r\u2028x", None),
    ("", None), ("  \t", None), (None, None),
])
def test_clean_label(raw: object, expected: str | None) -> None:
    assert clean_label(raw) == expected


def test_first_usable_variable_wins_in_the_order_given() -> None:
    env = {"GPUMOND_JOB_ID": "mine", "TORCHELASTIC_RUN_ID": "elastic-7", "SLURM_JOB_ID": "123456"}
    assert first_env(env, ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "GPUMOND_JOB_ID")) == ("SLURM_JOB_ID", "123456")
    assert first_env(env, ("GPUMOND_JOB_ID", "SLURM_JOB_ID")) == ("GPUMOND_JOB_ID", "mine")
    names = ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
    for unusable in ("", "  \t", "12\n34"):
        assert first_env({"SLURM_JOB_ID": unusable, "TORCHELASTIC_RUN_ID": "r1"}, names) == ("TORCHELASTIC_RUN_ID", "r1")
    assert first_env({"PATH": "/usr/bin"}, names) is None


def test_torchrun_default_run_id_none_is_no_job_id() -> None:
    assert first_env({"TORCHELASTIC_RUN_ID": "none"}, ("TORCHELASTIC_RUN_ID",)) is None
    assert first_env({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "7"},
                     ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")) == ("SLURM_JOB_ID", "7")
    assert first_env({"SLURM_JOB_ID": "none"}, ("SLURM_JOB_ID",)) == ("SLURM_JOB_ID", "none")
