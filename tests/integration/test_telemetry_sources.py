"""Both telemetry sources against real processes: sim agents, Prometheus and VictoriaMetrics on 127.0.0.1."""

from __future__ import annotations

import json
import math
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpumond.rules.telemetry import PrometheusSource, ScrapeSource
from gpumond.rules.types import GPU_SIGNALS, HOST_SIGNALS, GpuSample, TelemetryBatch, TelemetryNeed
from tests.integration.helpers import PrometheusServer, free_port, wait_until
from tests.integration.rules_helpers import VictoriaMetricsServer, running_agents

pytestmark = pytest.mark.integration

NODES = {"node-a": 4, "node-b": 4}
GPUS = sum(NODES.values())
# A steady load, so a value read through the TSDB a second late equals the direct one: the default
# training square wave swings power by ~40 % every few seconds.
STEADY = "default_load: {pattern: constant, utilization: 0.9, noise: 0}\n"
# What may still move under a steady load (relative, absolute): the thermal model settling.
# energy_j is a counter: the database's value and the direct scrape are taken seconds apart, and the
# counter grows by up to 700 J each simulated second in between.
# GPM activity is a ratio over the interval between the agent's two latest samples: a query and a direct scrape
# can read different intervals (and the same one in another float rounding).
TOLERANCE = {"power_w": (0.05, 0.0), "temperature_c": (0.0, 3.0), "energy_j": (0.0, 7_000.0),
             "sm_active": (0.0, 0.05), "tensor_active": (0.0, 0.05)}


@pytest.fixture
def sources() -> Iterator[list]:
    made: list = []
    yield made
    for s in made:
        s.close()


def _complete(batch: TelemetryBatch, nodes: set[str]) -> bool:
    """Every GPU of `nodes` is there with every signal, and every node has host evidence."""
    gpus = [g for g in batch.gpus if g.node in nodes]
    return (len(gpus) == sum(NODES[n] for n in nodes) and all(set(g.values) == set(GPU_SIGNALS) for g in gpus)
            and {h.node for h in batch.hosts} >= nodes)


def _when_complete(source: ScrapeSource | PrometheusSource) -> Callable[[], TelemetryBatch | None]:
    """A wait_until probe: one fetch, returned once it holds every GPU and host of NODES."""
    def probe() -> TelemetryBatch | None:
        batch = source.fetch()
        return batch if _complete(batch, set(NODES)) else None

    return probe


def _assert_same_gpus(got: TelemetryBatch, want: TelemetryBatch) -> None:
    """Same GPUs, identities and jobs; values equal, or within TOLERANCE for those that move."""
    def ident(g: GpuSample) -> tuple[str, str, str, bool, tuple[str, ...]]:
        return g.uuid, g.node, g.gpu, g.up, g.jobs

    assert sorted(map(ident, got.gpus)) == sorted(map(ident, want.gpus))
    direct = {g.uuid: g for g in want.gpus}
    for g in got.gpus:
        d = direct[g.uuid]
        assert set(g.values) == set(d.values) == set(GPU_SIGNALS), (g.uuid, g.values, d.values)
        for key, v in g.values.items():
            rel, abs_ = TOLERANCE.get(key, (0.0, 0.0))
            assert math.isclose(v, d.values[key], rel_tol=rel, abs_tol=abs_), (g.uuid, key, v, d.values[key])
    assert {h.node: set(h.values) for h in got.hosts} == {h.node: set(h.values) for h in want.hosts}
    assert all(set(h.values) == set(HOST_SIGNALS) for h in got.hosts)


def test_scrape_source_reads_real_agents_and_marks_dead_ones_absent(tmp_path: Path, sources: list) -> None:
    dead = f"127.0.0.1:{free_port()}"
    with running_agents(NODES, tmp_path) as agents:
        a, b = agents["node-a"], agents["node-b"]
        src = ScrapeSource([a.address, b.address, dead], timeout_s=2.0)
        sources.append(src)

        batch = wait_until(_when_complete(src), timeout=10, what="all 8 simulated GPUs with every signal")
        assert len(batch.gpus) == GPUS and len({g.uuid for g in batch.gpus}) == GPUS
        assert {g.node for g in batch.gpus} == set(NODES) and all(g.up for g in batch.gpus)
        assert all(0 < g.values["power_w"] <= g.values["power_limit_w"] for g in batch.gpus)
        assert batch.absent_nodes == {"127.0.0.1"}  # a dead target is named by its host: nothing else is known
        assert len(batch.errors) == 1 and batch.errors[0].startswith(f"scrape {dead}: ")

        a.stop(sig=signal.SIGKILL)  # no goodbye: the socket just closes
        batch = src.fetch()
        assert {g.node for g in batch.gpus} == {"node-b"} and len(batch.gpus) == NODES["node-b"]
        assert batch.absent_nodes == {"node-a", "127.0.0.1"}  # node-a keeps the name its agent gave
        assert len(batch.errors) == 2

        # The same fleet through file_sd, where the operator's node label beats the agent's hostname.
        sd = tmp_path / "targets.json"
        sd.write_text(json.dumps([{"targets": [b.address], "labels": {"node": "rack2-b"}}]), encoding="utf-8")
        via_sd = ScrapeSource(file_sd=sd, timeout_s=2.0)
        sources.append(via_sd)
        batch = via_sd.fetch()
        assert {g.node for g in batch.gpus} == {"rack2-b"} and batch.errors == ()


def _prometheus(targets: list[str], workdir: Path) -> PrometheusServer:
    return PrometheusServer(targets, workdir)


def _victoria_metrics(targets: list[str], workdir: Path) -> VictoriaMetricsServer:
    return VictoriaMetricsServer(targets, workdir)


@pytest.mark.parametrize("server", [_prometheus, _victoria_metrics], ids=["prometheus", "victoria-metrics"])
def test_query_source_matches_a_direct_scrape_and_marks_stopped_agents_absent(
        server: Callable[[list[str], Path], PrometheusServer | VictoriaMetricsServer], tmp_path: Path,
        sources: list) -> None:
    scenario = tmp_path / "steady.yaml"
    scenario.write_text(STEADY, encoding="utf-8")
    with running_agents(NODES, tmp_path, ["--sim-scenario", scenario]) as agents:
        addresses = [a.address for a in agents.values()]
        with server(addresses, tmp_path / "tsdb") as tsdb:
            src = PrometheusSource(tsdb.base_url, timeout_s=5.0, lookback_s=120)
            direct = ScrapeSource(addresses, timeout_s=2.0)
            sources += [src, direct]

            # Prometheus takes ~5 s to start scraping, VictoriaMetrics ~10 s to show new series.
            batch = wait_until(_when_complete(src), timeout=30, describe=tsdb.describe,
                               what=f"{tsdb.label} to hold all 8 GPUs with every signal")
            assert batch.errors == () and batch.absent_nodes == frozenset()
            _assert_same_gpus(batch, direct.fetch())

            # Between refreshes (promql_tiers): narrowed queries on the real server, the rarely asked signals
            # reused; at one instant, the same batch as every query in full.
            now = time.time()
            tiered = PrometheusSource(tsdb.base_url, timeout_s=5.0, lookback_s=120, clock=lambda: now)
            full = PrometheusSource(tsdb.base_url, timeout_s=5.0, lookback_s=120, clock=lambda: now, refresh_s=0)
            sources += [tiered, full]
            tiered.fetch()

            def agree() -> tuple | None:
                # Even at one query instant a sample the server had not yet made visible (VictoriaMetrics holds back
                # its newest ones) may appear between the two fetches: they agree once it is visible to both. A
                # defect in the narrowed queries never agrees, and fails when the wait runs out.
                between, everything = tiered.fetch(), full.fetch()
                assert between.errors == everything.errors == ()
                same = (between.gpus, between.hosts, between.absent_nodes) == (everything.gpus, everything.hosts,
                                                                               everything.absent_nodes)
                return (between, everything) if same else None

            between, everything = wait_until(agree, timeout=15, describe=tsdb.describe,
                                             what="the fetch between refreshes to equal the fetch in full")
            assert _complete(between, set(NODES))

            # For what the detectors need (promql_need): node-a's GPUs through an instance matcher the real server
            # runs, as a fetch of everything gives them (node-b's without values); then, between detail fetches, a
            # GPU on node-b suspected: its node asked in full, node-a's samples passed on as they were.
            mine = frozenset(g.uuid for g in everything.gpus if g.node == "node-a")
            suspect = next(g.uuid for g in everything.gpus if g.node == "node-b")
            needy = PrometheusSource(tsdb.base_url, timeout_s=5.0, lookback_s=120, clock=lambda: now, detail_s=60)
            sources.append(needy)
            needy.fetch()  # learns the identity: which target holds which GPU
            # Each compared with a fetch of everything right after it: even at one query instant, a sample the
            # server had not yet made visible (VictoriaMetrics holds back its newest ones) may appear later.
            detail, at_detail = needy.fetch(TelemetryNeed(gpus=mine)), full.fetch()
            later, at_later = needy.fetch(TelemetryNeed(gpus=mine, suspects=frozenset({suspect}))), full.fetch()
            assert detail.errors == later.errors == at_detail.errors == at_later.errors == ()

            def on(batch: TelemetryBatch, node: str) -> list[GpuSample]:
                return [g for g in batch.gpus if g.node == node]

            assert on(detail, "node-a") == on(at_detail, "node-a")
            assert [h for h in detail.hosts if h.node == "node-a"] == [h for h in at_detail.hosts
                                                                       if h.node == "node-a"]
            assert all(not g.values.keys() & {"power_w", "sm_clock_hz"} for g in on(detail, "node-b"))
            assert on(later, "node-b") == on(at_later, "node-b")
            assert all(x is y for x, y in zip(on(later, "node-a"), on(detail, "node-a"), strict=True))

            agents["node-a"].stop()

            def node_a_absent() -> TelemetryBatch | None:
                b = src.fetch()
                return b if b.absent_nodes == {"node-a"} else None

            batch = wait_until(node_a_absent, timeout=15, what=f"{tsdb.label} to report node-a absent",
                               describe=tsdb.describe)
            assert {g.node for g in batch.gpus} == {"node-b"} and len(batch.gpus) == NODES["node-b"]
            assert {h.node for h in batch.hosts} == {"node-b"} and batch.errors == ()


def test_query_source_reads_gpus_without_the_throttle_bitmask_through_the_per_reason_series(
        tmp_path: Path, sources: list) -> None:
    # node-b's series reach Prometheus without the bitmask (as from an agent older than it): its GPUs' throttle
    # reasons come from the per-reason series, node-a's from the bitmask, between refreshes as in full.
    scenario = tmp_path / "steady.yaml"
    scenario.write_text(STEADY, encoding="utf-8")
    with running_agents(NODES, tmp_path, ["--sim-scenario", scenario]) as agents:
        drop = {"source_labels": ["__name__"], "regex": "gpumond_gpu_clocks_event_reasons_bitmask", "action": "drop"}
        old = {"job_name": "gpumond-old", "scrape_interval": "1s", "scrape_timeout": "1s",
               "static_configs": [{"targets": [agents["node-b"].address]}], "metric_relabel_configs": [drop]}
        with PrometheusServer([agents["node-a"].address], tmp_path / "tsdb", extra_scrape_configs=[old]) as tsdb:
            tsdb.wait_for('count(gpumond_gpu_up{job="gpumond-old"}) + count(gpumond_gpu_clocks_event_reasons_bitmask)',
                          lambda r: r and float(r[0]["value"][1]) == GPUS, what="both nodes scraped")
            assert tsdb.query('gpumond_gpu_clocks_event_reasons_bitmask{job="gpumond-old"}') == []
            direct = ScrapeSource([a.address for a in agents.values()], timeout_s=2.0)
            sources.append(direct)
            now = time.time()
            tiered = PrometheusSource(tsdb.base_url, timeout_s=5.0, lookback_s=120, clock=lambda: now)
            full = PrometheusSource(tsdb.base_url, timeout_s=5.0, lookback_s=120, clock=lambda: now, refresh_s=0)
            sources += [tiered, full]
            first = wait_until(_when_complete(tiered), timeout=30, describe=tsdb.describe,
                               what="prometheus to hold all 8 GPUs with every signal")
            between, everything = tiered.fetch(), full.fetch()
            assert first.errors == between.errors == everything.errors == ()
            assert _complete(between, set(NODES)) and between.gpus == everything.gpus
            _assert_same_gpus(between, direct.fetch())
