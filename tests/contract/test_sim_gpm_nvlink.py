"""The simulated GPM and NVLink calls through real pynvml: answers, struct versions and refusals as an H100 (and a
V100, without GPM) gives them."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml as N
import pytest

from gpumond.nvml.sim import ManualClock, Scenario, SimulatedNvml


@pytest.fixture
def node() -> Iterator[tuple[SimulatedNvml, ManualClock]]:
    clock = ManualClock()
    sim = SimulatedNvml(gpu_count=2, clock=clock, scenario=Scenario.model_validate(
        {"gpus": [{"index": 1, "model": "v100-sxm2"}], "default_load": {"pattern": "constant", "utilization": 1.0}}))
    sim.install()
    N.nvmlInit()
    try:
        yield sim, clock
    finally:
        N.nvmlShutdown()
        sim.uninstall()


def _metrics(a, b, ids) -> N.c_nvmlGpmMetricsGet_t:
    m = N.c_nvmlGpmMetricsGet_t()
    m.version, m.numMetrics, m.sample1, m.sample2 = N.NVML_GPM_METRICS_GET_VERSION, len(ids), a, b
    for i, metric_id in enumerate(ids):
        m.metrics[i].metricId = metric_id
    return m


def test_gpm_support_and_samples_follow_the_model(node) -> None:
    sim, clock = node
    h100, v100 = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
    assert N.nvmlGpmQueryDeviceSupport(h100).isSupportedDevice == 1
    assert N.nvmlGpmQueryDeviceSupport(v100).isSupportedDevice == 0
    a, b = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlGpmSampleGet(v100, a)
    N.nvmlGpmSampleGet(h100, a)
    clock.advance(2.0)
    N.nvmlGpmSampleGet(h100, b)
    ids = [N.NVML_GPM_METRIC_SM_UTIL, N.NVML_GPM_METRIC_ANY_TENSOR_UTIL, N.NVML_GPM_METRIC_NVLINK_L17_TX_PER_SEC,
           N.NVML_GPM_METRIC_INTEGER_UTIL]
    got = N.nvmlGpmMetricsGet(_metrics(a, b, ids))
    sm, tensor, link17, integer = (got.metrics[i] for i in range(4))
    assert sm.nvmlReturn == N.NVML_SUCCESS and 84 < sm.value <= 85.0  # 0.85 × full load, in percent
    assert tensor.value == pytest.approx(sm.value * 0.6)
    assert link17.nvmlReturn == N.NVML_SUCCESS and link17.value > 0  # MiB/s on the last of 18 links
    assert integer.nvmlReturn == N.NVML_ERROR_NOT_SUPPORTED  # one metric refused, the call still succeeds
    assert sm.metricInfo.unit == b"%" and link17.metricInfo.unit == b"MiB/sec"
    for sample in (a, b):
        N.nvmlGpmSampleFree(sample)
    assert sim._gpm_samples == {}


def test_gpm_refuses_wrong_versions_and_samples_that_do_not_make_an_interval(node) -> None:
    _, clock = node
    h = N.nvmlDeviceGetHandleByIndex(0)
    a, b, empty = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    N.nvmlGpmSampleGet(h, a)
    N.nvmlGpmSampleGet(h, b)  # same instant as a
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlGpmMetricsGet(_metrics(a, b, [N.NVML_GPM_METRIC_SM_UTIL]))  # no time between them
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlGpmMetricsGet(_metrics(a, empty, [N.NVML_GPM_METRIC_SM_UTIL]))  # a sample never filled
    clock.advance(1.0)
    N.nvmlGpmSampleGet(h, b)
    wrong = _metrics(a, b, [N.NVML_GPM_METRIC_SM_UTIL])
    wrong.version = N.NVML_GPM_METRICS_GET_VERSION + 1
    with pytest.raises(N.NVMLError_ArgumentVersionMismatch):
        N.nvmlGpmMetricsGet(wrong)
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlGpmSampleFree(N.c_nvmlGpmSample_t())  # not allocated


def test_nvlink_state_counters_and_fields_and_a_link_past_the_models_count(node) -> None:
    sim, clock = node
    h100, v100 = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
    assert N.nvmlDeviceGetNvLinkVersion(h100, 0) == N.NVML_NVLINK_VERSION_4_0
    assert N.nvmlDeviceGetNvLinkVersion(v100, 5) == N.NVML_NVLINK_VERSION_2_0
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceGetNvLinkState(v100, 6)  # a V100 has 6 links
    sim.inject({"kind": "nvlink_degraded", "gpu": 0, "link": 2, "rate": 100})
    sim.inject({"kind": "nvlink_down", "gpu": 0, "link": 3})
    clock.advance(10.0)
    assert N.nvmlDeviceGetNvLinkState(h100, 3) == 0 and N.nvmlDeviceGetNvLinkState(h100, 2) == 1
    replay = N.nvmlDeviceGetNvLinkErrorCounter(h100, 2, N.NVML_NVLINK_ERROR_DL_REPLAY)
    assert replay == pytest.approx(1000, abs=2)  # 100/s for 10 s
    assert N.nvmlDeviceGetNvLinkErrorCounter(h100, 3, N.NVML_NVLINK_ERROR_DL_RECOVERY) == 1  # it retrained once
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetNvLinkErrorCounter(h100, 0, N.NVML_NVLINK_ERROR_DL_ECC_DATA)
    tx = N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    count, healthy, degraded, down, past = N.nvmlDeviceGetFieldValues(
        h100, [N.NVML_FI_DEV_NVLINK_LINK_COUNT, (tx, 0), (tx, 2), (tx, 3), (tx, 18)])
    assert (count.nvmlReturn, count.value.uiVal) == (N.NVML_SUCCESS, 18)
    assert degraded.value.ullVal < healthy.value.ullVal  # replays eat the link's bandwidth
    assert down.value.ullVal < degraded.value.ullVal  # no traffic since it went down
    assert past.nvmlReturn == N.NVML_ERROR_INVALID_ARGUMENT
    (total,) = N.nvmlDeviceGetFieldValues(h100, [N.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL])
    assert total.value.ullVal == replay


def test_a_fault_on_a_link_the_model_lacks_is_refused_in_one_line(node) -> None:
    sim, _ = node
    from gpumond.nvml.sim import ScenarioError

    with pytest.raises(ScenarioError, match=r"^fault.gpu: GPU 1 \(v100-sxm2\) has no NVLink 6 \(6 links\)$"):
        sim.inject({"kind": "nvlink_down", "gpu": 1, "link": 6})
    with pytest.raises(ScenarioError, match="busy_idle|SM activity factor"):
        sim.inject({"kind": "busy_idle", "gpu": 0, "factor": 1.5})
