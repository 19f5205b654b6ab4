"""The simulated nvidia-smi (gpumond/nvml/sim/nvidia_smi.py) reads the simulated GPUs through real pynvml."""

from __future__ import annotations

import pytest

from gpumond.nvml.sim import Scenario, nvidia_smi
from gpumond.nvml.sim.gpu import gpu_uuid

FMT = "csv,noheader,nounits"


def test_a_query_prints_each_gpus_state_in_nvidia_smis_units(make_sim) -> None:
    sim = make_sim(gpus=2, node="smi-node")
    fields = ["index", "uuid", "temperature.gpu", "power.draw", "memory.total", "clocks.max.sm",
              "clocks_event_reasons.active", "ecc.mode.current"]
    lines = nvidia_smi.query(fields, FMT).splitlines()
    assert len(lines) == 2
    for i, line in enumerate(lines):
        gpu = sim.gpus[i]
        row = dict(zip(fields, line.split(", "), strict=True))
        assert row["index"] == str(i) and row["uuid"] == gpu_uuid("smi-node", i)
        assert row["temperature.gpu"] == str(round(gpu.temperature_c))
        assert float(row["power.draw"]) == pytest.approx(gpu.power_avg_w, abs=0.01)
        assert int(row["memory.total"]) == gpu.memory_total_bytes // 2**20
        assert int(row["clocks.max.sm"]) == gpu.spec.sm_max_mhz
        assert int(row["clocks_event_reasons.active"], 16) == gpu.clock_event_reasons
        assert row["ecc.mode.current"] == "Enabled"


def test_a_call_the_simulated_library_lacks_prints_not_supported(make_sim) -> None:
    make_sim(gpus=1)
    assert nvidia_smi.query(["index", "pcie.link.gen.current"], FMT) == "0, [Not Supported]"


def test_a_field_value_the_gpu_lacks_prints_not_supported_though_the_call_succeeds(make_sim) -> None:
    v100 = Scenario.model_validate({"gpus": [{"index": 0, "model": "v100-sxm2"}]})  # no HBM sensor, no power fields
    make_sim(gpus=1, scenario=v100)
    assert nvidia_smi.query(["index", "temperature.memory", "power.draw.average"], FMT) == (
        "0, [Not Supported], [Not Supported]")


def test_an_unknown_field_or_format_is_refused_as_nvidia_smi_does(make_sim) -> None:
    make_sim(gpus=1)
    with pytest.raises(SystemExit, match='Field "fan.speedy" is not a valid field to query'):
        nvidia_smi.query(["index", "fan.speedy"], FMT)
    with pytest.raises(SystemExit, match="csv,noheader,nounits only"):
        nvidia_smi.query(["index"], "csv")


def test_the_help_lists_every_field_it_answers(make_sim) -> None:
    assert nvidia_smi.help_query().count('\n"') == len(nvidia_smi.FIELDS)
