"""A real Prometheus scrapes `gpumond agent --sim 8`; promtool lints the live exposition."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import pytest

from tests.integration.helpers import (
    AgentProcess,
    PrometheusServer,
    by_label,
    parse_metrics,
    promtool_check_metrics,
    scalar,
)

pytestmark = pytest.mark.integration

GPUS = 8
COLLECTORS = ("nvml_fast", "nvml_slow", "host", "xid", "jobs")


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    """One healthy agent on 8 simulated GPUs, shared by this module's tests."""
    with AgentProcess(["--sim", str(GPUS)], tmp_path_factory.mktemp("agent")) as a:
        yield a


def test_prometheus_scrapes_eight_healthy_gpus(agent: AgentProcess, start_prometheus) -> None:
    prom: PrometheusServer = start_prometheus([agent.address])

    prom.wait_for("count(gpumond_gpu_up == 1)", lambda r: scalar(r) == GPUS, timeout=30,
                  what=f"Prometheus to see {GPUS} GPUs with gpumond_gpu_up == 1")

    up = prom.query('up{job="gpumond"}')
    assert [(r["metric"]["instance"], float(r["value"][1])) for r in up] == [(agent.address, 1.0)]

    info = prom.query("gpumond_gpu_info")
    assert len(info) == GPUS
    assert len({r["metric"]["uuid"] for r in info}) == GPUS, info
    assert {r["metric"]["gpu"] for r in info} == {str(i) for i in range(GPUS)}
    assert all(r["metric"]["uuid"].startswith("GPU-") and r["metric"]["pci_bus_id"] for r in info), info

    temps = by_label(prom.query("gpumond_gpu_temperature_celsius"), "gpu")
    assert len(temps) == GPUS, temps
    assert all(20.0 <= t <= 95.0 for t in temps.values()), f"implausible die temperatures: {temps}"

    power = by_label(prom.query("gpumond_gpu_power_watts"), "gpu")
    assert len(power) == GPUS and all(p > 0 for p in power.values()), power
    # Joined on gpu: every GPU draws at most its enforced limit, and none exceeds it.
    within = prom.query("gpumond_gpu_power_watts <= on(gpu) gpumond_gpu_power_limit_watts")
    assert {r["metric"]["gpu"] for r in within} == set(power), within
    assert prom.query("gpumond_gpu_power_watts > on(gpu) gpumond_gpu_power_limit_watts") == []

    success = by_label(prom.query("gpumond_collector_success"), "collector")
    assert {c: success.get(c) for c in COLLECTORS} == {c: 1.0 for c in COLLECTORS}, success


def test_promtool_check_metrics_is_silent(agent: AgentProcess) -> None:
    text = agent.metrics_text()
    assert "gpumond_gpu_up" in text
    rc, output = promtool_check_metrics(text)
    assert (rc, output) == (0, ""), f"promtool check metrics exited {rc}:\n{output}"


def _shape(text: str) -> dict[str, tuple[str, str, frozenset[tuple[str, tuple[tuple[str, str], ...]]]]]:
    """Families → (type, help, {(sample name, labels)}): everything but the values, which move."""
    return {name: (m.type, m.documentation,
                   frozenset((s.name, tuple(sorted(s.labels.items()))) for s in m.samples))
            for name, m in parse_metrics(text).items()}


def test_gzip_exposition_decodes_to_the_same_families(agent: AgentProcess) -> None:
    status, headers, body = agent.get("/metrics", {"Accept-Encoding": "gzip"})
    assert status == 200
    assert headers.get("content-encoding") == "gzip", headers
    assert headers.get("content-type", "").startswith("text/plain; version=0.0.4"), headers
    gz_text = gzip.decompress(body).decode("utf-8")

    status, headers, plain = agent.get("/metrics", {"Accept-Encoding": "identity"})
    assert status == 200
    assert "content-encoding" not in headers, headers
    plain_text = plain.decode("utf-8")

    gz_shape, plain_shape = _shape(gz_text), _shape(plain_text)
    assert sorted(gz_shape) == sorted(plain_shape)
    assert gz_shape == plain_shape
    assert len(gz_shape["gpumond_gpu_up"][2]) == GPUS


def test_gzip_refused_with_q0_gets_plain_text(agent: AgentProcess) -> None:
    status, headers, body = agent.get("/metrics", {"Accept-Encoding": "identity, gzip;q=0"})
    assert status == 200
    assert "content-encoding" not in headers, headers
    assert body.startswith(b"# HELP")
