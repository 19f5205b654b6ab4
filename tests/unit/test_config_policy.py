"""The `policy:` section of the agent config: defaults, accepted shapes, and errors that name the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpumond.config import AgentConfig, PowerSetting, format_validation_error, gpu_selector_kind

UUID = "GPU-5b0c3a3e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"


def validate(policy: dict) -> AgentConfig:
    return AgentConfig.model_validate({"policy": policy}, context={"hostname": "node-a"})


def error_line(policy: dict) -> str:
    with pytest.raises(ValidationError) as info:
        validate(policy)
    return format_validation_error("agent.yaml", info.value, AgentConfig)


def test_defaults() -> None:
    policy = validate({}).policy
    assert policy.mode == "dry_run" and policy.restore_on_exit is True
    assert policy.power_limit.default_w is None and len(policy.power_limit.per_gpu) == 0
    thermal = policy.thermal
    assert thermal.enabled and thermal.target_c is None and thermal.memory_target_c is None
    assert (thermal.margin_c, thermal.hysteresis_c, thermal.step_w, thermal.interval_s) == (5, 3, 10, 5)
    assert thermal.floor_w is None
    assert (policy.alerts.throttle_after_s, policy.alerts.floor_after_s) == (60, 300)
    assert AgentConfig.default().policy == policy


def test_watts_and_percent_settings() -> None:
    per_gpu = {"0": 350, UUID: "92.5%", "NVIDIA H100 80GB HBM3": 500.5}
    limits = validate({"power_limit": {"default_w": "80%", "per_gpu": per_gpu}}).policy.power_limit
    assert limits.default_w == PowerSetting(percent=80.0)
    assert limits.per_gpu.get("0") == PowerSetting(watts=350.0)
    assert limits.per_gpu.get(UUID.upper()) == PowerSetting(percent=92.5)  # UUIDs ignore case
    assert limits.per_gpu.get("NVIDIA H100 80GB HBM3") == PowerSetting(watts=500.5)
    assert limits.per_gpu.get("1") is None


def test_yaml_integer_keys_are_indices() -> None:
    per_gpu = validate({"power_limit": {"per_gpu": {3: 300}}}).policy.power_limit.per_gpu
    assert per_gpu.get("3") == PowerSetting(watts=300.0)


def test_round_trips_through_json_and_stays_hashable() -> None:
    config = validate({"mode": "DRY_RUN", "power_limit": {"default_w": "80%", "per_gpu": {"1": 300}}})
    assert config.policy.mode == "dry_run"
    dumped = config.model_dump(mode="json")["policy"]
    assert dumped["power_limit"] == {"default_w": "80%", "per_gpu": {"1": 300.0}}
    assert AgentConfig.model_validate(config.model_dump(mode="json")) == config
    hash(config)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ({"mode": "on"}, "policy.mode: must be one of 'enforce', 'dry_run' or 'off' (got 'on')"),
        ({"restore_on_exit": "yes"}, "policy.restore_on_exit: must be a valid boolean (got 'yes')"),
        ({"power_limit": {"default_w": "80 %"}},
         'policy.power_limit.default_w: must be watts (a number) or a percentage of the default limit, '
         'e.g. "80%" (got \'80 %\')'),
        ({"power_limit": {"default_w": "0%"}},
         "policy.power_limit.default_w: a percentage must be greater than 0% and at most 200% (got '0%')"),
        ({"power_limit": {"default_w": "200.5%"}},
         "policy.power_limit.default_w: a percentage must be greater than 0% and at most 200% (got '200.5%')"),
        ({"power_limit": {"default_w": -5}},
         "policy.power_limit.default_w: watts must be a number greater than 0 (got -5)"),
        ({"power_limit": {"default_w": True}},
         'policy.power_limit.default_w: must be watts (a number) or a percentage of the default limit, '
         'e.g. "80%" (got true)'),
        ({"power_limit": {"per_gpu": {"0": "lots"}}},
         'policy.power_limit.per_gpu.0: must be watts (a number) or a percentage of the default limit, '
         'e.g. "80%" (got \'lots\')'),
        ({"power_limit": {"per_gpu": [300]}}, "policy.power_limit.per_gpu: must be a mapping of keys (got [300])"),
        ({"power_limit": {"defualt_w": 300}}, "policy.power_limit.defualt_w: unknown key (did you mean 'default_w'?)"),
        ({"thermal": {"step_w": 0}}, "policy.thermal.step_w: must be greater than 0 (got 0)"),
        ({"thermal": {"interval_s": 0.5}}, "policy.thermal.interval_s: must be at least 1 (got 0.5)"),
        ({"thermal": {"target_c": "85"}}, "policy.thermal.target_c: must be a valid number (got '85')"),
        ({"thermal": {"target_c": 150}}, "policy.thermal.target_c: must be at most 110 (got 150)"),
        ({"thermal": {"memory_target_c": 10}}, "policy.thermal.memory_target_c: must be at least 30 (got 10)"),
        ({"thermal": {"hysteresis_c": -1}}, "policy.thermal.hysteresis_c: must be at least 0 (got -1)"),
        ({"thermal": {"floor_w": 0}}, "policy.thermal.floor_w: must be greater than 0 (got 0)"),
        ({"thermal": {"margin_c": 50}}, "policy.thermal.margin_c: must be at most 40 (got 50)"),
        ({"thermal": {"enabled": 1}}, "policy.thermal.enabled: must be a valid boolean (got 1)"),
        ({"alerts": {"throttle_after_s": -1}}, "policy.alerts.throttle_after_s: must be at least 0 (got -1)"),
        ({"alerts": {"floor_after_s": 90000}}, "policy.alerts.floor_after_s: must be at most 86400 (got 90000)"),
        ({"throttle_alert_after_s": 60}, "policy.throttle_alert_after_s: unknown key"),
    ],
)
def test_every_error_names_its_field(policy: dict, expected: str) -> None:
    assert error_line(policy) == f"agent.yaml: {expected}"


@pytest.mark.parametrize("selector", ["GPU-12", "GPU-5b0c3a3e", "MIG-5b0c3a3e-1c2d-4e5f-8a9b-0c1d2e3f4a5b", "",
                                      "  ", " H100", "-1", "+2", "01"])
def test_bad_selectors_are_named(selector: str) -> None:
    line = error_line({"power_limit": {"per_gpu": {selector: 300}}})
    assert line.startswith(f"agent.yaml: policy.power_limit.per_gpu: {selector!r} is not a GPU index")


def test_negative_integer_key_is_not_an_index() -> None:
    assert "'-1' is not a GPU index" in error_line({"power_limit": {"per_gpu": {-1: 300}}})


def test_the_same_gpu_twice_is_an_error() -> None:
    line = error_line({"power_limit": {"per_gpu": {UUID: 300, UUID.upper(): 310}}})
    assert "names the same GPUs as" in line


@pytest.mark.parametrize(
    ("selector", "kind"),
    [("0", "index"), ("17", "index"), (UUID, "uuid"), (UUID.upper(), "uuid"),
     ("NVIDIA H100 80GB HBM3", "model"), ("Tesla V100-SXM2-32GB", "model"), ("GPU-x", None), ("", None)],
)
def test_selector_kinds(selector: str, kind: str | None) -> None:
    assert gpu_selector_kind(selector) == kind
