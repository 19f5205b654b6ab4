"""Job SDK settings: explicit arguments beat the environment, and which variable wins when several are set."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumond.job.settings import (
    ConfigError,
    Identity,
    resolve_endpoint,
    resolve_identity,
    resolve_token,
)

LOCAL = "GPU-10ca1000-0000-4000-8000-000000000000"
ENV = "GPU-e0e0e0e0-0000-4000-8000-000000000000"
ARG = "GPU-a0a0a0a0-0000-4000-8000-000000000000"
FOUND = "GPU-f0f0f0f0-0000-4000-8000-000000000000"


def identity(environ: dict[str, str], gpu: str | None = LOCAL, **explicit: object) -> Identity:
    """resolve_identity with every argument None unless given, and a fake local-GPU lookup."""
    args: dict[str, object] = dict(job=None, rank=None, world_size=None, node=None, gpu_uuid=None, group=None)
    args.update(explicit)
    return resolve_identity(**args, environ=environ, find_gpu=lambda env: gpu)  # type: ignore[arg-type]


FULL_ENV = {
    "GPUMOND_JOB_ID": "env-job", "RANK": "3", "WORLD_SIZE": "8", "GPUMOND_NODE": "env-node",
    "GPUMOND_GPU_UUID": ENV, "GPUMOND_GROUP": "env-group",
}


def test_environment_fills_every_field() -> None:
    assert identity(FULL_ENV) == Identity("env-job", 3, 8, "env-node", ENV, "env-group")


def test_explicit_arguments_beat_the_environment() -> None:
    got = identity(FULL_ENV, job="arg-job", rank=1, world_size=2, node="arg-node", gpu_uuid=ARG,
                   group="arg-group")
    assert got == Identity("arg-job", 1, 2, "arg-node", ARG, "arg-group")


@pytest.mark.parametrize(("env", "job"), [
    ({"SLURM_JOB_ID": "4242", "TORCHELASTIC_RUN_ID": "rdzv-7"}, "4242"),  # torchrun inside sbatch
    ({"TORCHELASTIC_RUN_ID": "rdzv-7"}, "rdzv-7"),
    ({"GPUMOND_JOB_ID": "mine", "SLURM_JOB_ID": "4242", "TORCHELASTIC_RUN_ID": "rdzv-7"}, "mine"),
    ({"SLURM_JOB_ID": "  ", "TORCHELASTIC_RUN_ID": "rdzv-7"}, "rdzv-7"),  # blank is unset
    ({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": ""}, None),  # torchrun's default id names no job
])
def test_job_id_precedence(env: dict[str, str], job: str | None) -> None:
    if job is None:
        with pytest.raises(ConfigError, match="GPUMOND_JOB_ID, SLURM_JOB_ID, TORCHELASTIC_RUN_ID"):
            identity(env)
    else:
        assert identity(env).job == job


def test_rank_and_world_size_prefer_torchrun_over_slurm() -> None:
    env = {"SLURM_JOB_ID": "1", "RANK": "5", "SLURM_PROCID": "1", "WORLD_SIZE": "16", "SLURM_NTASKS": "2"}
    got = identity(env)
    assert (got.rank, got.world_size) == (5, 16)


def test_slurm_rank_and_tasks_when_torchrun_is_absent() -> None:
    got = identity({"SLURM_JOB_ID": "1", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"})
    assert (got.rank, got.world_size) == (1, 2)


def test_single_process_defaults() -> None:
    got = identity({"GPUMOND_JOB_ID": "j"})
    assert (got.rank, got.world_size, got.group) == (0, 1, None)
    assert got.node  # the hostname


@pytest.mark.parametrize(("env", "explicit", "message"), [
    ({"RANK": "two"}, {}, "RANK must be an integer"),
    ({"WORLD_SIZE": "0"}, {}, "WORLD_SIZE must be ≥ 1"),
    ({}, {"rank": -1}, "rank must be ≥ 0"),
    ({}, {"rank": True}, "rank must be an integer"),
    ({}, {"world_size": 2.5}, "world_size must be an integer"),
    ({"RANK": "4", "WORLD_SIZE": "4"}, {}, "rank 4 is not below world_size 4"),
    ({"RANK": "1"}, {}, "rank 1 is not below world_size 1"),
])
def test_bad_rank_or_world_size_names_the_source(env: dict[str, str], explicit: dict[str, object],
                                                 message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        identity({"GPUMOND_JOB_ID": "j", **env}, **explicit)


def test_gpu_uuid_explicit_then_env_then_local_device() -> None:
    env = {"GPUMOND_JOB_ID": "j"}
    assert identity({**env, "GPUMOND_GPU_UUID": ENV}, gpu_uuid=ARG).gpu_uuid == ARG
    assert identity({**env, "GPUMOND_GPU_UUID": ENV}).gpu_uuid == ENV
    assert identity(env, gpu=FOUND).gpu_uuid == FOUND
    with pytest.raises(ConfigError, match="GPU UUID"):
        identity(env, gpu=None)


def test_local_device_is_not_looked_up_when_uuid_is_given() -> None:
    def boom(env: object) -> str:
        raise AssertionError("looked up")

    got = resolve_identity(job="j", rank=None, world_size=None, node=None, gpu_uuid=ARG, group=None,
                           environ={}, find_gpu=boom)
    assert got.gpu_uuid == ARG


def test_endpoint_from_argument_or_environment() -> None:
    assert resolve_endpoint("http://a:1", {"GPUMOND_ENDPOINT": "http://b:2"}) == "http://a:1"
    assert resolve_endpoint(None, {"GPUMOND_ENDPOINT": "http://b:2"}) == "http://b:2"
    with pytest.raises(ConfigError, match="GPUMOND_ENDPOINT"):
        resolve_endpoint(None, {})


def test_token_precedence(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    env = {"GPUMOND_TOKEN": "from-env", "GPUMOND_TOKEN_FILE": str(token_file)}
    assert resolve_token("from-arg", env) == "from-arg"
    assert resolve_token(None, env) == "from-env"
    assert resolve_token(None, {"GPUMOND_TOKEN_FILE": str(token_file)}) == "from-file"
    with pytest.raises(ConfigError, match="GPUMOND_TOKEN or GPUMOND_TOKEN_FILE"):
        resolve_token(None, {})


def test_token_problems_never_show_the_token(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read GPUMOND_TOKEN_FILE") as missing:
        resolve_token(None, {"GPUMOND_TOKEN_FILE": str(tmp_path / "absent")})
    assert "absent" in str(missing.value)
    with pytest.raises(ConfigError, match="whitespace") as spaced:
        resolve_token("sec ret", {})
    assert "sec ret" not in str(spaced.value)


@pytest.mark.parametrize(("explicit", "env", "found", "source"), [
    ({"gpu_uuid": "MIG-1234"}, {}, None, "gpu_uuid must be an NVML GPU UUID"),
    ({}, {"GPUMOND_GPU_UUID": "0"}, None, "GPUMOND_GPU_UUID must be an NVML GPU UUID"),
    ({}, {}, "GPU-12", "the local device must be an NVML GPU UUID"),
])
def test_a_malformed_gpu_uuid_is_refused_once_here(explicit: dict[str, object], env: dict[str, str],
                                                    found: str | None, source: str) -> None:
    with pytest.raises(ConfigError, match=source):
        identity({"GPUMOND_JOB_ID": "j", **env}, gpu=found, **explicit)
