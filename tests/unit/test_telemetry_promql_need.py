"""Telemetry fetched for what the detectors need (promql_need): equal to a fetch of everything where they read.

A fake query API holds a small fleet whose every value changes every fetch and answers the queries the source
sends, full or narrowed to some instances (it parses the `instance=~` matcher), so the need path and the
reference path (no need: everything, every fetch) read the same data; the stores they fill are compared.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pytest

from gpumond.config.rules import RulesConfig
from gpumond.rules.evaluator import Evaluator
from gpumond.rules.store import GpuStore, RankStore
from gpumond.rules.telemetry import PrometheusSource, Row, build_queries, signals
from gpumond.rules.telemetry.promql_join import IDENTITY, TARGETS
from gpumond.rules.telemetry.promql_need import MAX_MATCHER_CHARS, selection
from gpumond.rules.types import RankInfo, StepRecord, TelemetryBatch, TelemetryNeed
from tests.unit.test_telemetry_promql import FakePrometheus, _vector

NODES = 6
GPUS = 2
_MATCHER = re.compile(r'instance=~"((?:[^"\\]|\\.)*)",?')


def _target(n: int) -> dict[str, str]:
    return {"job": "gpumond", "instance": f"10.0.0.{n}:9480"}


def _uuid(n: int, g: int) -> str:
    return f"GPU-{n}-{g}"


class Fleet:
    """NODES nodes of GPUS GPUs; every value a function of the time asked, so each fetch reads something new."""

    def __init__(self) -> None:
        self.by_query = {q: key for key, q in build_queries(300).items()}
        self.t = 0.0
        self.down: set[int] = set()  # targets whose `up` is 0
        self.selected = 0  # series answered, over all queries

    def rows(self, key: str) -> list[Row]:
        t, out = self.t, []
        for n in range(NODES):
            tgt = _target(n)
            if key == TARGETS:
                out.append(Row(tgt, 0.0 if n in self.down else 1.0))
                continue
            if n in self.down and key != IDENTITY:
                continue
            if key in signals.HOST_SERIES.values():
                out.append(Row(tgt, (t * 7 + n * 3 + len(key)) % 97 / 100))
                continue
            for g in range(GPUS):
                labels = {**tgt, "uuid": _uuid(n, g), "gpu": str(g)}
                v = (t * 13 + n * 5 + g * 3 + len(key)) % 101
                if key == IDENTITY:
                    out.append(Row({**labels, "hostname": f"node-{n}"}, 1.0))
                elif key == signals.GPU_UP:
                    out.append(Row(labels, 0.0 if (n, g) == (5, 1) else 1.0))
                elif key == signals.JOB_INFO:
                    out.append(Row({**labels, "job": f"job-{n // 3}"}, 1.0))
                elif key == signals.CLOCKS_EVENT_MASK:
                    out.append(Row(labels, float(0x4 if v % 3 == 0 else 0x40 if v % 3 == 1 else 0)))
                elif key in (signals.MIG_INFO, signals.ALERT_ACTIVE, signals.CLOCKS_EVENT):
                    continue
                elif key in {m for m, _ in signals.GPU_SERIES.values()} and signals.SELECTOR_LABEL.get(key) is None:
                    out.append(Row(labels, v))
        return out

    def respond(self, query: str) -> tuple[int, object]:
        nonzero = query.endswith(" != 0")
        query = query.removesuffix(" != 0")
        if query.startswith("up{job=~"):
            rows = self.rows(TARGETS)
        else:
            m = _MATCHER.search(query)
            wanted = re.compile(m.group(1).replace("\\\\", "\\")) if m else None
            base = _MATCHER.sub("", query).replace("{}", "") if m else query
            rows = [r for r in self.rows(self.by_query[base])
                    if wanted is None or wanted.fullmatch(r.labels["instance"])]
        rows = [r for r in rows if r.value != 0 or not nonzero]
        self.selected += len(rows)
        return 200, _vector(rows)


@pytest.fixture()
def fleet() -> Iterator[tuple[Fleet, FakePrometheus]]:
    world = Fleet()
    prom = FakePrometheus(world.respond)
    try:
        yield world, prom
    finally:
        prom.close()


def _source(url: str, world: Fleet, **kw: object) -> PrometheusSource:
    return PrometheusSource(url, timeout_s=2.0, clock=lambda: world.t, **kw)  # type: ignore[arg-type]


def _store() -> GpuStore:
    return GpuStore(window_s=300, expire_after_s=900, max_gpus=1000, max_samples=1000)


def _run(world: Fleet, url: str, times: list[float], need: TelemetryNeed | None, **kw: object
         ) -> tuple[list[TelemetryBatch], GpuStore, int]:
    src, store, batches = _source(url, world, **kw), _store(), []
    world.selected = 0
    try:
        for t in times:
            world.t = t
            batches.append(src.fetch(need))
            store.add(batches[-1])
    finally:
        src.close()
    return batches, store, world.selected


NEEDED = frozenset(_uuid(n, g) for n in (0, 1) for g in range(GPUS))  # the shard's jobs sit on nodes 0 and 1
# The GPU values a detail fetch narrows (the max clock, power limit and throttle reasons stay fleet-wide).
GAUGES = {"power_w", "sm_clock_hz", "utilization", "temperature_c", "energy_j"}
TIMES = [1000.0 + 10 * i for i in range(9)]


def test_every_fetch_narrowed_to_the_shards_nodes_gives_the_detectors_what_a_full_fetch_gives(fleet) -> None:
    world, prom = fleet
    need = TelemetryNeed(gpus=NEEDED)
    ref, ref_store, ref_selected = _run(world, prom.url, TIMES, None)
    got, store, selected = _run(world, prom.url, TIMES, need)
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        assert a.errors == b.errors == ()
        assert [g for g in a.gpus if g.uuid in NEEDED] == [g for g in b.gpus if g.uuid in NEEDED]
        assert [h for h in a.hosts if h.node in ("node-0", "node-1")] == [h for h in b.hosts if h.node in
                                                                          ("node-0", "node-1")]
        assert (a.absent_nodes, a.alerts) == (b.absent_nodes, b.alerts)
        # Every GPU is still there for fleet remediation: its `up` and node, without the values no detector reads.
        assert [(g.uuid, g.node, g.up) for g in a.gpus] == [(g.uuid, g.node, g.up) for g in b.gpus]
        if i:  # the first fetch knows no identity yet, so it asks everything
            assert all(not g.jobs and not g.values.keys() & GAUGES for g in a.gpus if g.uuid not in NEEDED)
    since = TIMES[0] - 1
    ours, reference = store.windows(NEEDED, since), ref_store.windows(NEEDED, since)
    assert ours == reference
    for u in NEEDED:
        np.testing.assert_array_equal(ours[u].columns.data, reference[u].columns.data)
    assert selected < ref_selected * 0.6


def test_between_detail_fetches_suspects_are_fresh_and_everyone_else_is_passed_on(fleet) -> None:
    world, prom = fleet
    suspect = _uuid(1, 1)
    need = TelemetryNeed(gpus=NEEDED, suspects=frozenset({suspect}))
    ref, ref_store, ref_selected = _run(world, prom.url, TIMES, None)
    got, store, selected = _run(world, prom.url, TIMES, need, detail_s=30)
    detail = {TIMES[0], TIMES[3], TIMES[6]}
    fresh = {_uuid(1, g) for g in range(GPUS)}
    for t, a, b in zip(TIMES, got, ref, strict=True):
        assert a.errors == () and (a.absent_nodes, a.alerts) == (b.absent_nodes, b.alerts)
        mine = {g.uuid: g for g in a.gpus}
        theirs = {g.uuid: g for g in b.gpus}
        assert mine.keys() == theirs.keys()
        for u in fresh:  # the suspect's node: what a fetch of everything gives, every fetch
            assert mine[u] == theirs[u]
        for u in mine.keys() - fresh:
            assert mine[u].t == max(d for d in detail if d <= t)  # the others: their last detail sample
        assert a.hosts == tuple(h if h.node == "node-1" else _at(ref, max(d for d in detail if d <= t), h.node)
                                for h in a.hosts)
    since = TIMES[0] - 1
    ours, reference = store.windows(NEEDED, since), ref_store.windows(NEEDED, since)
    for u in fresh:
        assert ours[u] == reference[u]
        np.testing.assert_array_equal(ours[u].columns.data, reference[u].columns.data)
    for u in NEEDED - fresh:  # each sample once, at the detail fetches, equal to the reference's there
        kept = [i for i, s in enumerate(reference[u]) if s.t in detail]
        assert ours[u] == tuple(reference[u][i] for i in kept)
        np.testing.assert_array_equal(ours[u].columns.data, reference[u].columns.data[:, kept])
    assert selected < ref_selected * 0.45  # 3 detail fetches of 9, on a fleet of 6 nodes with 2 needed


def _at(batches: list[TelemetryBatch], t: float, node: str) -> object:
    return next(h for b in batches if b.t == t for h in b.hosts if h.node == node)


def test_a_target_that_goes_down_between_detail_fetches_is_absent_at_once(fleet) -> None:
    world, prom = fleet
    src = _source(prom.url, world, detail_s=60)
    need = TelemetryNeed(gpus=NEEDED)
    try:
        world.t = 1000.0
        assert _uuid(0, 0) in {g.uuid for g in src.fetch(need).gpus}
        world.t, world.down = 1010.0, {0}
        batch = src.fetch(need)
    finally:
        src.close()
    assert batch.absent_nodes == {"node-0"}
    assert {g.node for g in batch.gpus} == {f"node-{n}" for n in range(1, NODES)}
    assert all(g.t == 1000.0 for g in batch.gpus)


def test_suspects_on_most_of_the_fleet_make_every_fetch_a_detail_fetch(fleet) -> None:
    world, prom = fleet
    everyone = frozenset(_uuid(n, g) for n in range(NODES) for g in range(GPUS))
    got, _, _ = _run(world, prom.url, TIMES[:3], TelemetryNeed(gpus=everyone, suspects=everyone), detail_s=60)
    ref, _, _ = _run(world, prom.url, TIMES[:3], None)
    assert [b.gpus for b in got] == [b.gpus for b in ref]


def test_a_failed_detail_fetch_is_asked_again_by_the_next_fetch(fleet) -> None:
    world, prom = fleet
    src = _source(prom.url, world, detail_s=60)
    need = TelemetryNeed(gpus=NEEDED)
    respond = world.respond
    try:
        world.t = 1000.0
        src.fetch(need)
        world.t = 1060.0
        prom.respond = lambda q: (503, b"down") if q.startswith(signals.GPU_UP) else respond(q)  # type: ignore
        failed = src.fetch(need)
        prom.respond = respond  # type: ignore[method-assign]
        world.t = 1070.0
        again = src.fetch(need)
    finally:
        src.close()
    assert failed.gpus == () and failed.errors
    assert {g.t for g in again.gpus} == {1070.0} and len(again.gpus) == NODES * GPUS


def _identity(instances: list[str]) -> list[Row]:
    return [Row({"job": "gpumond", "instance": i, "uuid": f"u{k}"}, 1.0) for k, i in enumerate(instances)]


@pytest.mark.parametrize(("uuids", "want"), [
    (set(), ""),  # nothing needed: nothing asked
    ({"u0"}, 'instance=~"a\\\\.b:1"'),  # matched literally (RE2, then the string's escapes)
    ({"u0", "u1"}, 'instance=~"a\\\\.b:1|c:2"'),
    ({"u0", "u1", "u2"}, None),  # more than half the fleet's targets: asking them all costs no more
])
def test_selection_names_the_targets_of_the_needed_gpus(uuids: set[str], want: str | None) -> None:
    assert selection(_identity(["a.b:1", "c:2", "d:3", "e:4", "f:5"]), uuids) == want


def test_a_selection_longer_than_a_server_takes_asks_the_whole_fleet() -> None:
    instances = [f"host-{i:06d}.example.org:9480" for i in range(2000)]
    few = {f"u{k}" for k in range(MAX_MATCHER_CHARS // 30)}
    assert selection(_identity(instances), few) is None
    assert selection(None, {"u0"}) is None  # no identity yet: everything


def test_the_evaluator_asks_for_its_jobs_gpus_after_its_first_evaluation() -> None:
    config = RulesConfig.model_validate({"tokens": ["push-token-0123456789"]})
    ranks = RankStore.from_config(config)
    for r in range(2):
        ranks.record(RankInfo("job-a", r, 2, "node-0", _uuid(0, r)),
                     [StepRecord(s, 1000.0 + s, 0.5, 0.01) for s in range(10)], 1010.0)

    class Recording:
        name = "recording"

        def __init__(self) -> None:
            self.asked: list[TelemetryNeed | None] = []

        def fetch(self, need: TelemetryNeed | None = None) -> TelemetryBatch:
            self.asked.append(need)
            return TelemetryBatch(t=1010.0)

        def close(self) -> None:
            pass

    source = Recording()
    ev = Evaluator(ranks, GpuStore.from_config(config), source, clock=lambda: 1010.0)
    ev.poll_telemetry()
    ev.evaluate()
    ev.poll_telemetry()
    assert source.asked == [None, TelemetryNeed(gpus=frozenset({_uuid(0, 0), _uuid(0, 1)}))]


def test_detail_s_is_read_from_the_config_and_must_stay_below_expire_after_s() -> None:
    from gpumond.rules.telemetry import build_source

    config = RulesConfig.model_validate({"tokens": ["push-token-0123456789"], "telemetry": {
        "prometheus": {"url": "http://127.0.0.1:1", "detail_s": 45}}})
    src = build_source(config.telemetry)
    try:
        assert src._cadence.detail_s == 45.0  # noqa: SLF001
    finally:
        src.close()
    with pytest.raises(ValueError, match="more than telemetry.prometheus.detail_s"):
        RulesConfig.model_validate({"tokens": ["push-token-0123456789"], "window_s": 60, "expire_after_s": 60,
                                    "telemetry": {"prometheus": {"url": "http://127.0.0.1:1", "detail_s": 60}}})


