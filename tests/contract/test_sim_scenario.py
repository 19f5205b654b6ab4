"""Scenario files: the shipped examples load and run; bad input fails with one line that
names the file, the entry and the field."""

from __future__ import annotations

from importlib import resources

import pynvml
import pytest

from gpumond.nvml.sim import FAULT_KINDS, ManualClock, ScenarioError, SimulatedNvml, load_scenario

SCENARIOS = resources.files("gpumond.nvml.sim") / "scenarios"


@pytest.mark.parametrize("name", ["demo.yaml", "healthy.yaml"])
def test_shipped_scenarios_load(name):
    scenario = load_scenario(SCENARIOS / name)
    SimulatedNvml(gpu_count=4, scenario=scenario, clock=ManualClock())


def test_demo_scenario_plays_out():
    clock = ManualClock()
    sim = SimulatedNvml(gpu_count=8, scenario=load_scenario(SCENARIOS / "demo.yaml"), clock=clock)
    clock.advance(130)
    gpus = sim.gpus
    assert gpus[1].temperature_c > max(g.temperature_c for g in gpus if g.index != 1) + 5
    assert gpus[2].xid_counts == {48: 1} and gpus[2].remap_pending
    assert gpus[3].lost and not any(g.lost for g in gpus if g.index != 3)
    with sim:
        pynvml.nvmlInit()
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetHandleByIndex(3)


def write(tmp_path, text, name="scenario.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "expected"), [
    ("faults:\n  - {gpu: 0, kind: cooling, factor: 2}\n  - {gpu: 1, kind: coolng, factor: 2}\n",
     "scenario.yaml: faults[1].kind: unknown fault kind 'coolng' (expected one of cooling, inlet,"),
    ("faults:\n  - {gpu: 0, kind: cooling, factor: hot}\n",
     "scenario.yaml: faults[0].factor: must be a valid number"),
    ("faults:\n  - {gpu: 0, kind: cooling}\n",
     "scenario.yaml: faults[0].factor: required for kind 'cooling'"),
    ("faults:\n  - {gpu: 0, kind: xid, code: 48, factor: 2}\n",
     "scenario.yaml: faults[0].factor: not a parameter of kind 'xid'"),
    ("faults:\n  - {kind: lost}\n",
     "scenario.yaml: faults[0].gpu: required for kind 'lost'"),
    ("faults:\n  - {gpu: -1, kind: lost}\n",
     "scenario.yaml: faults[0].gpu: expected a GPU index (>= 0) or 'all', got -1"),
    ("faults:\n  - {gpu: 0, kind: lost, colour: red}\n",
     "scenario.yaml: faults[0].colour: unknown key"),
    ("faults:\n  - {gpu: 0, kind: nvml_error, function: nvmlDeviceGetPowerUsage, error: on_fire}\n",
     "scenario.yaml: faults[0].error: unknown NVML error 'on_fire'"),
    ("faults:\n  - {gpu: 0, kind: nvml_error, function: nvmlDeviceGetPowerUsed, error: unknown}\n",
     "scenario.yaml: faults[0].function: unknown NVML function 'nvmlDeviceGetPowerUsed'"),
    ("faults:\n  - {gpu: 0, kind: load, pattern: training, busy_fraction: 1.5}\n",
     "scenario.yaml: faults[0].busy_fraction: must be at most 1 (got 1.5)"),
    ("faults:\n  - {gpu: 0, kind: slow, factor: 1.5}\n",
     "scenario.yaml: faults[0].factor: a slowdown factor must be in (0, 1]"),
    ("gpus:\n  - {index: 0, model: a100}\n",
     "scenario.yaml: gpus[0].model: unknown model 'a100' (expected one of h100-sxm, v100-sxm2)"),
    ("gpus:\n  - {index: 0}\n  - {index: 0}\n",
     "scenario.yaml: gpus[1].index: GPU 0 is listed twice"),
    ("gpus:\n  - {index: 0, model: v100-sxm2, mig: [1g.10gb]}\n",
     "scenario.yaml: gpus[0].mig: model 'v100-sxm2' has no MIG mode"),
    ("gpus:\n  - {index: 0, mig: [1g.5gb]}\n",
     "scenario.yaml: gpus[0].mig: unknown MIG profile '1g.5gb' for h100-sxm (expected one of 1g.10gb, "),
    ("gpus:\n  - {index: 0, mig: [4g.40gb, 4g.40gb]}\n",
     "scenario.yaml: gpus[0].mig: the profiles take 8 compute slices; a GPU has 7"),
    ("default_load: {pattern: sawtooth}\n",
     "scenario.yaml: default_load.pattern: must be one of 'constant', 'idle' or 'training'"),
    ("inlet: {base_c: 30, period: 60}\n",
     "scenario.yaml: inlet.period: unknown key (did you mean 'period_s'?)"),
    ("- just\n- a list\n",
     "scenario.yaml: top level must be a mapping of keys (got a list)"),
    ("faults: [\n",
     "scenario.yaml: line 2: could not parse YAML"),
    ("faults: []\ngpus: []\nfaults: []\n",
     "scenario.yaml: line 3: could not parse YAML: duplicate key 'faults' (first on line 1)"),
])
def test_validation_errors_name_the_field(tmp_path, text, expected):
    with pytest.raises(ScenarioError) as caught:
        load_scenario(write(tmp_path, text))
    message = str(caught.value)
    assert message.startswith(expected), message
    assert "\n" not in message


def test_kind_list_is_complete_in_the_message(tmp_path):
    with pytest.raises(ScenarioError) as caught:
        load_scenario(write(tmp_path, "faults:\n  - {gpu: 0, kind: nope}\n"))
    assert all(kind in str(caught.value) for kind in FAULT_KINDS)


def test_gpu_out_of_range_is_caught_when_the_node_is_built(tmp_path):
    scenario = load_scenario(write(tmp_path, "faults:\n  - {gpu: 9, kind: lost, at_s: 5}\n"))
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.gpu: GPU 9 does not exist \(gpu_count=8\)"):
        SimulatedNvml(gpu_count=8, scenario=scenario, clock=ManualClock())


def test_missing_file_and_empty_file(tmp_path):
    with pytest.raises(ScenarioError, match="nope.yaml: cannot read"):
        load_scenario(tmp_path / "nope.yaml")
    assert load_scenario(write(tmp_path, "")).faults == []


def test_inject_validates_like_a_scenario():
    sim = SimulatedNvml(gpu_count=2, clock=ManualClock())
    with pytest.raises(ScenarioError, match=r"^fault: code: required for kind 'xid'"):
        sim.inject({"gpu": 0, "kind": "xid"})
    with pytest.raises(ScenarioError, match=r"fault.gpu: GPU 5 does not exist"):
        sim.inject({"gpu": 5, "kind": "xid", "code": 48})


def test_a_scenario_holds_at_most_max_faults_with_one_line_past_it(tmp_path) -> None:
    from gpumond.nvml.sim.scenario import MAX_FAULTS

    path = tmp_path / "many.yaml"
    path.write_text("faults:\n" + "  - {gpu: 0, kind: xid, code: 48, at_s: 1}\n" * (MAX_FAULTS + 1))
    with pytest.raises(ScenarioError, match=r"^many\.yaml: faults: must have at most 10000 items \(got "):
        load_scenario(path)
