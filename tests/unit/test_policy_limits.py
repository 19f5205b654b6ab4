"""resolve_persistent_limit: which setting wins, and NVML constraints as errors, never clamps."""

from __future__ import annotations

import pytest

from gpumond.agent.policy.limits import LimitResolution, resolve_persistent_limit
from gpumond.agent.policy.view import GpuView
from gpumond.config import PowerLimitConfig

UUID = "GPU-5b0c3a3e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
H100 = "NVIDIA H100 80GB HBM3"


def gpu(**kw) -> GpuView:
    values = dict(index=0, uuid=UUID, name=H100, up=True, limit_min_w=200.0, limit_max_w=700.0,
                  limit_default_w=700.0)
    values.update(kw)
    return GpuView(**values)


def limits(**data) -> PowerLimitConfig:
    return PowerLimitConfig.model_validate(data)


def test_nothing_configured_leaves_the_board_alone() -> None:
    assert resolve_persistent_limit(gpu(), limits()) == LimitResolution(None)


def test_default_applies_to_every_gpu() -> None:
    got = resolve_persistent_limit(gpu(index=5), limits(default_w=450))
    assert (got.watts, got.error, got.source) == (450.0, None, "policy.power_limit.default_w")


@pytest.mark.parametrize(
    ("per_gpu", "watts", "source"),
    [
        ({"0": 400, H100: 500, UUID: 600}, 600.0, f'per_gpu["{UUID}"]'),
        ({"0": 400, H100: 500}, 400.0, 'per_gpu["0"]'),
        ({"1": 400, H100: 500}, 500.0, f'per_gpu["{H100}"]'),
        ({"1": 400}, 300.0, "default_w"),
        ({UUID.upper(): 610}, 610.0, f'per_gpu["{UUID}"]'),
    ],
)
def test_most_specific_selector_wins(per_gpu: dict, watts: float, source: str) -> None:
    got = resolve_persistent_limit(gpu(), limits(default_w=300, per_gpu=per_gpu))
    assert got.watts == watts and got.error is None
    assert got.source == f"policy.power_limit.{source}"


def test_percent_is_of_the_default_limit() -> None:
    assert resolve_persistent_limit(gpu(limit_default_w=600.0), limits(default_w="80%")).watts == 480.0


def test_percent_without_a_reported_default_is_an_error() -> None:
    got = resolve_persistent_limit(gpu(limit_default_w=None), limits(per_gpu={"0": "80%"}))
    assert got.watts is None
    assert got.error == ('policy.power_limit.per_gpu["0"]: 80% needs the GPU\'s default power limit, '
                         "which it does not report; give watts instead")


def test_above_the_maximum_is_an_error_not_a_clamp() -> None:
    got = resolve_persistent_limit(gpu(), limits(per_gpu={"0": 900}))
    assert got.watts is None
    assert got.error == ('policy.power_limit.per_gpu["0"]: 900 W is above this GPU\'s maximum of 700 W '
                         "(NVML constraints 200–700 W)")


def test_below_the_minimum_is_an_error() -> None:
    got = resolve_persistent_limit(gpu(), limits(default_w=150))
    assert got.error == ("policy.power_limit.default_w: 150 W is below this GPU's minimum of 200 W "
                         "(NVML constraints 200–700 W)")


def test_percent_out_of_range_says_what_it_came_to() -> None:
    got = resolve_persistent_limit(gpu(), limits(default_w="150%"))
    assert got.error == ("policy.power_limit.default_w: 150% of the 700 W default is 1050 W, which is above "
                         "this GPU's maximum of 700 W (NVML constraints 200–700 W)")


def test_the_edges_are_allowed() -> None:
    assert resolve_persistent_limit(gpu(), limits(default_w=200)).watts == 200.0
    assert resolve_persistent_limit(gpu(), limits(default_w="100%")).watts == 700.0


def test_unknown_constraints_refuse_to_act() -> None:
    got = resolve_persistent_limit(gpu(limit_max_w=None), limits(default_w=400))
    assert got.watts is None and "does not report its power-limit constraints" in (got.error or "")
