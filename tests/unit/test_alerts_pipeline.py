"""AlertPipeline: enrichment, the watchdog, what reaches sinks, wall-clock starts, restore, API and metrics.

The sinks here are a recording fake (the Sink protocol is the pipeline's injected dependency); the clocks
are injected: the daemon's clock is simulated and the wall clock is offset from it, with jitter.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from gpumond.alerts.catalogue import ALERTS
from gpumond.alerts.lifecycle import Persistence
from gpumond.alerts.model import Alert, Condition, rfc3339
from gpumond.alerts.pipeline import AlertPipeline
from gpumond.alerts.sinks import Snapshot
from gpumond.alerts.state import FILE_NAME, AlertStateFile
from gpumond.config.alerting import AlertingConfig
from gpumond.types import Series

WALL0 = 1_700_000_000.0  # wall time at daemon time 0


class RecordingSink:
    """Implements the Sink protocol; keeps every snapshot it is handed."""

    def __init__(self, name: str = "rec") -> None:
        self.name = name
        self.target = "test:1"
        self.snapshots: list[Snapshot] = []
        self.started = 0
        self.stopped = 0

    def publish(self, snapshot: Snapshot) -> None:
        self.snapshots.append(snapshot)

    def start(self) -> None:
        self.started += 1

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stopped += 1

    def series(self) -> list[Series]:
        return [Series("gpumond_alert_sink_sent_total", (("sink", self.name), ("target", self.target)), 7.0)]

    @property
    def last(self) -> dict[str, Alert]:
        return {a.alertname: a for a in self.snapshots[-1].alerts}


class Clocks:
    """The daemon's clock (`now`, passed to update) and a wall clock offset from it with microsecond jitter."""

    def __init__(self, offset: float = WALL0) -> None:
        self.offset = offset
        self.now = 0.0
        self.calls = 0

    def wall(self) -> float:
        self.calls += 1
        return self.offset + self.now + self.calls * 1e-6  # every read drifts a little, like a real clock


def make(tmp: Path | None = None, *, persistence: Persistence = Persistence(), clocks: Clocks | None = None,
         generator_url=lambda a: None, **cfg: object) -> tuple[AlertPipeline, RecordingSink, Clocks]:
    clocks = clocks or Clocks()
    sink = RecordingSink()
    state = AlertStateFile(None if tmp is None else tmp / FILE_NAME)
    p = AlertPipeline(AlertingConfig.model_validate(cfg), sinks=[sink], state=state, persistence=persistence,
                      generator_url=generator_url, wall=clocks.wall)
    return p, sink, clocks


def step(p: AlertPipeline, clocks: Clocks, now: float, *conditions: Condition):
    clocks.now = now
    return p.update(list(conditions), now)


def hw(node: str = "n1", **annotations: str) -> Condition:
    return Condition.of({"alertname": "GpuHwSlowdown", "severity": "critical", "node": node, "gpu": 0},
                        annotations)


def slow(for_s: float = 60.0) -> Condition:
    return Condition.of({"alertname": "GpuSwThermalSlowdown", "severity": "warning", "node": "n1", "gpu": 1},
                        {}, for_s)


# ----- enrich ---------------------------------------------------------------------------------------
def test_enrich_adds_cluster_runbook_and_catalogue_wording() -> None:
    p, sink, c = make(cluster="fleet-a", runbook_base_url="https://runbooks.example/gpu/")
    step(p, c, 0.0, hw())
    a = sink.last["GpuHwSlowdown"]
    assert a.label("cluster") == "fleet-a"
    assert a.annotation("runbook_url") == "https://runbooks.example/gpu/GpuHwSlowdown.md"
    assert a.annotation("summary") == ALERTS["GpuHwSlowdown"].summary
    assert a.annotation("description") == ALERTS["GpuHwSlowdown"].meaning


def test_enrich_keeps_a_summary_and_description_the_condition_gives() -> None:
    p, sink, c = make()
    step(p, c, 0.0, hw(summary="GPU 0 of n1 at 91 °C", description="clocks halved"))
    a = sink.last["GpuHwSlowdown"]
    assert (a.annotation("summary"), a.annotation("description")) == ("GPU 0 of n1 at 91 °C", "clocks halved")
    assert a.annotation("runbook_url") == \
        "https://github.com/gpumond/gpumond/blob/main/docs/runbooks/GpuHwSlowdown.md"
    assert a.label("cluster") is None  # no cluster configured: no label


def test_enrich_leaves_an_alert_outside_the_catalogue_without_runbook() -> None:
    p, sink, c = make(cluster="x")
    step(p, c, 0.0, Condition.of({"alertname": "LocalThing", "severity": "info"}))
    a = sink.last["LocalThing"]
    assert a.label("cluster") == "x" and a.annotation("runbook_url") is None


def test_watchdog_is_always_firing_when_on() -> None:
    p, sink, c = make(watchdog=True)
    step(p, c, 0.0)
    step(p, c, 10.0)
    wd = sink.last["Watchdog"]
    assert (wd.state, wd.severity) == ("firing", "info")
    assert wd.annotation("runbook_url").endswith("/Watchdog.md")
    assert all("Watchdog" in {a.alertname for a in s.alerts} for s in sink.snapshots)


def test_no_watchdog_by_default() -> None:
    p, sink, c = make()
    step(p, c, 0.0)
    assert sink.snapshots[-1].alerts == ()


# ----- what reaches sinks ---------------------------------------------------------------------------
def test_pending_alerts_never_reach_sinks() -> None:
    p, sink, c = make()
    step(p, c, 0.0, slow())
    step(p, c, 30.0, slow())
    assert [s.alerts for s in sink.snapshots] == [(), ()]
    assert [a.state for a in p.alerts()] == ["pending"]  # but the daemon's own API shows them
    step(p, c, 60.0, slow())
    assert [a.state for a in sink.snapshots[-1].alerts] == ["firing"]


def test_k_of_n_pending_alerts_never_reach_sinks() -> None:
    p, sink, c = make(persistence=Persistence(k=2, n=3, clear=3))
    step(p, c, 0.0, hw())
    step(p, c, 10.0)
    assert all(s.alerts == () for s in sink.snapshots)
    step(p, c, 20.0, hw())
    assert [a.state for a in sink.snapshots[-1].alerts] == ["firing"]


def test_snapshot_carries_generator_urls_and_wall_now() -> None:
    p, sink, c = make(generator_url=lambda a: f"http://n1:9480/metrics#{a.alertname}")
    step(p, c, 5.0, hw())
    snap = sink.snapshots[-1]
    (a,) = snap.alerts
    assert dict(snap.generator_urls) == {a.fingerprint: "http://n1:9480/metrics#GpuHwSlowdown"}
    assert abs(snap.now - (WALL0 + 5.0)) < 1e-3


# ----- wall-clock starts, fixed at the transition -----------------------------------------------------
def test_wall_start_is_fixed_at_the_transition_and_survives_jitter() -> None:
    p, sink, c = make()
    step(p, c, 100.0, hw())
    first = sink.last["GpuHwSlowdown"].starts_at
    assert abs(first - (WALL0 + 100.0)) < 1e-3
    for now in (115.0, 130.0, 145.0, 1000.0):  # re-sends: the wall clock drifts against the daemon's
        step(p, c, now, hw())
        assert sink.last["GpuHwSlowdown"].starts_at == first  # exactly: Alertmanager keys on it
        assert rfc3339(sink.last["GpuHwSlowdown"].starts_at) == rfc3339(first)
    assert p.alerts()[0].starts_at == first


def test_wall_start_of_a_pending_alert_is_when_it_fired() -> None:
    p, sink, c = make()
    for now in (0.0, 30.0, 60.0, 90.0):
        step(p, c, now, slow())
    assert abs(sink.last["GpuSwThermalSlowdown"].starts_at - (WALL0 + 60.0)) < 1e-3


def test_wall_end_is_fixed_at_the_resolve_and_the_start_kept() -> None:
    p, sink, c = make()
    step(p, c, 10.0, hw())
    start = sink.last["GpuHwSlowdown"].starts_at
    step(p, c, 20.0)
    resolved = sink.last["GpuHwSlowdown"]
    assert resolved.state == "resolved" and resolved.starts_at == start
    assert abs(resolved.ends_at - (WALL0 + 20.0)) < 1e-3  # type: ignore[operator]
    for now in (30.0, 40.0):  # still announced as resolved: the same end every time
        step(p, c, now)
        assert (sink.last["GpuHwSlowdown"].starts_at, sink.last["GpuHwSlowdown"].ends_at) == \
            (start, resolved.ends_at)


def test_wall_clock_step_after_firing_does_not_move_the_start() -> None:
    p, sink, c = make()
    step(p, c, 10.0, hw())
    start = sink.last["GpuHwSlowdown"].starts_at
    c.offset += 3600.0  # NTP (or a VM resume) steps the wall clock
    step(p, c, 20.0, hw())
    assert sink.last["GpuHwSlowdown"].starts_at == start


def test_daemon_clock_reads_stay_in_daemon_time() -> None:
    p, _, c = make()
    step(p, c, 10.0, hw())
    (a,) = p.firing()
    assert a.starts_at == 10.0
    assert p.entries()[0].active_since == 10.0


# ----- restore ---------------------------------------------------------------------------------------
def test_restore_from_the_state_file_seeds_firing_alerts(tmp_path: Path) -> None:
    before, _, c1 = make(tmp_path, cluster="fleet-a", restart_grace_s=120.0)
    step(before, c1, 50.0, hw())
    started = before.alerts()[0].starts_at
    assert (tmp_path / FILE_NAME).exists()

    # A new process: its daemon clock starts again at 0, its wall clock has moved on by an hour.
    after, sink, c2 = make(tmp_path, cluster="fleet-a", restart_grace_s=120.0,
                           clocks=Clocks(offset=WALL0 + 3600.0))
    after.start(0.0)
    assert sink.started == 1
    (restored,) = after.firing()
    assert restored.starts_at < 0  # daemon time: it began before this process did
    step(after, c2, 1.0)  # the detectors have not seen it yet
    a = sink.last["GpuHwSlowdown"]
    assert (a.state, a.starts_at) == ("firing", started)
    assert a.label("cluster") == "fleet-a"

    step(after, c2, 119.0)
    assert sink.last["GpuHwSlowdown"].state == "firing"  # held for restart_grace_s
    step(after, c2, 121.0)
    a = sink.last["GpuHwSlowdown"]
    assert a.state == "resolved" and a.starts_at == started
    assert abs(a.ends_at - (WALL0 + 3600.0 + 121.0)) < 1e-3  # type: ignore[operator]
    after.stop()
    assert sink.stopped == 1


def test_restored_alert_still_true_is_not_a_new_alert(tmp_path: Path) -> None:
    before, _, c1 = make(tmp_path)
    step(before, c1, 50.0, hw())
    started = before.alerts()[0].starts_at
    after, sink, c2 = make(tmp_path, clocks=Clocks(offset=WALL0 + 7.5))
    after.start(0.0)
    transitions = step(after, c2, 1.0, hw())
    assert transitions == ()
    assert sink.last["GpuHwSlowdown"].starts_at == started


def test_no_state_file_restores_nothing() -> None:
    p, sink, c = make()
    p.start(0.0)
    step(p, c, 1.0)
    assert p.firing() == () and sink.snapshots[-1].alerts == ()


# ----- what the daemon serves -------------------------------------------------------------------------
def _three_states() -> AlertPipeline:
    p, _, c = make(generator_url=lambda a: f"http://gen/{a.alertname}")
    other = Condition.of({"alertname": "GpuRowRemapPending", "severity": "warning", "node": "n1", "gpu": 2})
    step(p, c, 0.0, other)
    step(p, c, 10.0, hw(), slow())  # other resolves, hw fires, slow is pending
    return p


def test_api_json_shape_firing_first() -> None:
    body = json.loads(_three_states().api_json())
    assert list(body) == ["alerts"]
    alerts = body["alerts"]
    assert [(a["state"], a["labels"]["alertname"]) for a in alerts] == [
        ("firing", "GpuHwSlowdown"), ("pending", "GpuSwThermalSlowdown"), ("resolved", "GpuRowRemapPending")]
    for a in alerts:
        assert set(a) == {"labels", "annotations", "state", "startsAt", "endsAt", "fingerprint", "generatorURL"}
        assert a["generatorURL"] == f"http://gen/{a['labels']['alertname']}"
        assert a["startsAt"].endswith("Z") and len(a["fingerprint"]) == 16
        assert a["annotations"]["runbook_url"].endswith(f"/{a['labels']['alertname']}.md")
    firing, pending, resolved = alerts
    assert firing["endsAt"] is None and pending["endsAt"] is None
    # Both at the transition at daemon time 10, in wall-clock time.
    assert firing["startsAt"] == resolved["endsAt"] == rfc3339(WALL0 + 10.0)
    assert resolved["startsAt"] == rfc3339(WALL0) and pending["startsAt"] == rfc3339(WALL0 + 10.0)


def test_api_json_fingerprint_matches_the_labels() -> None:
    p, sink, c = make(cluster="fleet-a")
    step(p, c, 0.0, hw())
    (entry,) = json.loads(p.api_json())["alerts"]
    assert entry["fingerprint"] == sink.last["GpuHwSlowdown"].fingerprint
    assert entry["labels"]["cluster"] == "fleet-a"


def test_series_counts_alerts_by_state_and_includes_every_sink() -> None:
    p = _three_states()
    series = p.series()
    counts = {dict(s.labels)["state"]: s.value for s in series if s.name == "gpumond_alerts"}
    assert counts == {"pending": 1.0, "firing": 1.0, "resolved": 1.0}
    sink_series = [s for s in series if s.name != "gpumond_alerts"]
    assert sink_series == p.sinks[0].series()


def test_series_with_no_alerts_still_has_every_state() -> None:
    p, _, _ = make()
    counts = {dict(s.labels)["state"]: s.value for s in p.series() if s.name == "gpumond_alerts"}
    assert counts == {"pending": 0.0, "firing": 0.0, "resolved": 0.0}


def test_every_sink_gets_every_snapshot() -> None:
    sinks = [RecordingSink("a"), RecordingSink("b")]
    c = Clocks()
    p = AlertPipeline(AlertingConfig(), sinks=sinks, state=AlertStateFile(None), wall=c.wall)
    step(p, c, 0.0, hw())
    step(p, c, 1.0, hw())
    assert [len(s.snapshots) for s in sinks] == [2, 2]
    assert sinks[0].snapshots[-1] is sinks[1].snapshots[-1]
    names = [dict(s.labels).get("sink") for s in p.series() if s.name == "gpumond_alert_sink_sent_total"]
    assert names == ["a", "b"]


class StuckSink(RecordingSink):
    """A sink whose stop() is stuck in a request until every other stuck sink's stop() has begun too."""

    def __init__(self, name: str, rendezvous: threading.Barrier) -> None:
        super().__init__(name)
        self._rendezvous = rendezvous
        self.met = False

    def stop(self, timeout_s: float = 5.0) -> None:
        super().stop(timeout_s)
        try:
            self._rendezvous.wait(timeout=timeout_s)
            self.met = True
        except threading.BrokenBarrierError:
            pass


def test_stop_stops_every_sink_at_once_not_one_after_the_other() -> None:
    # Stopped one after the other, the first stuck sink waits its whole timeout for a second that has not begun:
    # with N hanging sinks, SIGTERM would take N × timeout.
    rendezvous = threading.Barrier(3)
    sinks = [StuckSink(f"stuck-{i}", rendezvous) for i in range(3)]
    p = AlertPipeline(AlertingConfig(), sinks=sinks, state=AlertStateFile(None))
    p.start(0.0)
    p.stop(timeout_s=5.0)
    assert [s.stopped for s in sinks] == [1, 1, 1]
    assert all(s.met for s in sinks)
