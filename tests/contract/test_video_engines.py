"""Encoder and decoder utilization (NVML's video engines, dcgm-exporter's ENC_UTIL / DEC_UTIL) from the simulated
NVML under real pynvml, through the sampler's slow cycle into both namings."""

from __future__ import annotations

import pynvml

from gpumond.agent.dcgm import DcgmCompat
from tests.agent_sampler import node_sampler
from gpumond.nvml.sim import Scenario

# GPU 0 transcodes video beside its work, GPU 1 trains (engines idle), GPU 2 is in MIG mode.
VIDEO = {"pattern": "constant", "utilization": 0.6, "encoder_utilization": 0.25, "decoder_utilization": 0.5}
SCENARIO = Scenario.model_validate({"gpus": [{"index": 0, "load": VIDEO}, {"index": 2, "mig": ["3g.40gb"]}]})
NAMES = ("gpumond_gpu_encoder_utilization_ratio", "gpumond_gpu_decoder_utilization_ratio",
         "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL")


def test_pynvml_reads_each_engines_utilization_and_its_sampling_period(make_sim) -> None:
    make_sim(gpus=3, scenario=SCENARIO)
    h0, h1, h2 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(3))
    assert pynvml.nvmlDeviceGetEncoderUtilization(h0) == [25, 1_000_000]
    assert pynvml.nvmlDeviceGetDecoderUtilization(h0) == [50, 1_000_000]
    assert pynvml.nvmlDeviceGetEncoderUtilization(h1)[0] == pynvml.nvmlDeviceGetDecoderUtilization(h1)[0] == 0
    for read in (pynvml.nvmlDeviceGetEncoderUtilization, pynvml.nvmlDeviceGetDecoderUtilization):
        try:
            read(h2)
            raise AssertionError("MIG mode: not counted for the board")
        except pynvml.NVMLError_NotSupported:
            pass


def test_the_agent_exports_them_as_ratios_and_in_dcgm_naming_as_percent(make_session) -> None:
    _, session, _ = make_session(gpus=3, scenario=SCENARIO)
    sampler = node_sampler(session, hostname="n", dcgm=DcgmCompat(hostname="n"), timer=lambda: 0.0, clock=lambda: 0.0)
    sampler.slow_cycle()
    sampler.fast_cycle()
    assert sampler.last_snapshot is not None
    got = {(s.name, dict(s.labels)["gpu"]): s.value for r in sampler.last_snapshot.results for s in r.series
           if s.name in NAMES}
    assert got == {
        ("gpumond_gpu_encoder_utilization_ratio", "0"): 0.25, ("gpumond_gpu_decoder_utilization_ratio", "0"): 0.5,
        ("gpumond_gpu_encoder_utilization_ratio", "1"): 0.0, ("gpumond_gpu_decoder_utilization_ratio", "1"): 0.0,
        ("DCGM_FI_DEV_ENC_UTIL", "0"): 25.0, ("DCGM_FI_DEV_DEC_UTIL", "0"): 50.0,
        ("DCGM_FI_DEV_ENC_UTIL", "1"): 0.0, ("DCGM_FI_DEV_DEC_UTIL", "1"): 0.0,
    }  # GPU 2 (MIG mode): left out, never 0
