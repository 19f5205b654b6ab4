"""Deferred step timing (gpumond.job.intervals) and the Reporter's late comm waits, on a fake GPU timeline.

The CUDA path's logic: steps are read only once their events have completed, in order, never by waiting;
a step that stays incomplete too long is dropped and counted; each late reading lands on its own step.
"""

from __future__ import annotations

from collections.abc import Hashable

import pytest

from gpumond.job import Reporter
from gpumond.job import reporter as reporter_module
from gpumond.job.intervals import HostEvent, Intervals
from tests.fakes import FakeClock, FakeTransport
from tests.unit.fake_gpu import FakeStream

GPU = "GPU-abcabcab-0000-4000-8000-0000000000ab"


def _intervals(stream: FakeStream, max_lag: int = 3) -> tuple[Intervals, list[tuple[Hashable, float | None]]]:
    got: list[tuple[Hashable, float | None]] = []
    return Intervals(stream.event, lambda t, s: got.append((t, s)), max_lag=max_lag), got


def _step(iv: Intervals, stream: FakeStream, ticket: Hashable, *spans: tuple[float, float]) -> None:
    for begin, end in spans:
        stream.t = begin
        iv.begin()
        stream.t = end
        iv.end()
    iv.close_step(ticket)


def test_a_step_is_read_once_its_events_complete_and_not_before() -> None:
    stream = FakeStream()
    iv, got = _intervals(stream)
    _step(iv, stream, "a", (1.0, 1.25))
    iv.poll()
    assert got == [] and iv.in_flight == 1  # the GPU has not got there: nothing read, nothing waited for
    stream.reach(1.1)
    iv.poll()
    assert got == []  # the start has completed, the end not yet
    stream.reach(1.25)
    iv.poll()
    assert got == [("a", 0.25)] and iv.in_flight == 0 and iv.read == 1


def test_steps_come_out_in_order_with_their_intervals_summed() -> None:
    stream = FakeStream()
    iv, got = _intervals(stream)
    _step(iv, stream, 1, (0.0, 0.5), (1.0, 1.25))  # FSDP: one interval per all-gather, summed per step
    _step(iv, stream, 2, (2.0, 2.125))
    _step(iv, stream, 3, (3.0, 3.0625))
    stream.reach(2.5)
    iv.poll()
    assert got == [(1, 0.75), (2, 0.125)]
    stream.reach(9.0)
    iv.poll()
    assert got[2:] == [(3, 0.0625)]


def test_a_step_still_incomplete_max_lag_steps_later_is_dropped_and_counted() -> None:
    stream = FakeStream()
    iv, got = _intervals(stream, max_lag=2)
    for n in range(3):
        _step(iv, stream, n, (n, n + 0.5))
        iv.poll()
    assert got == [(0, None)] and iv.dropped == 1  # step 0 is 2 steps behind: given up, not waited for
    stream.reach(1.5)
    iv.poll()
    assert got == [(0, None), (1, 0.5)] and iv.in_flight == 1


def test_events_are_reused_so_steady_state_allocates_none() -> None:
    stream = FakeStream()
    iv, _ = _intervals(stream)
    for n in range(50):
        _step(iv, stream, n, (n, n + 0.5))
        stream.reach(n + 0.5)
        iv.poll()
    assert stream.created <= 4


def test_cancel_gives_up_every_step_in_flight_and_a_discarded_step_is_never_read() -> None:
    stream = FakeStream()
    iv, got = _intervals(stream)
    _step(iv, stream, "x", (0.0, 1.0))
    stream.t = 2.0
    iv.begin()
    iv.discard()  # a backward that raised: its half interval must not leak into the next step
    _step(iv, stream, "y", (3.0, 3.5))
    iv.cancel()
    assert got == [("x", None), ("y", None)] and iv.dropped == 2
    assert not iv.close_step("z")  # no intervals: nothing to read


def test_an_unreadable_event_costs_its_step_not_the_caller() -> None:
    class Broken:
        def record(self) -> None: ...
        def query(self) -> bool: raise RuntimeError("driver went away")
        def elapsed_s(self, end: object) -> float: return 0.0

    got: list[tuple[Hashable, float | None]] = []
    iv = Intervals(Broken, lambda t, s: got.append((t, s)))
    iv.begin()
    iv.end()
    iv.close_step(7)
    iv.poll()
    assert got == [(7, None)]


def test_host_events_are_complete_at_once() -> None:
    clock = FakeClock(100.0)
    got: list[tuple[Hashable, float | None]] = []
    iv = Intervals(lambda: HostEvent(clock), lambda t, s: got.append((t, s)))
    iv.begin()
    clock.advance(0.25)
    iv.end()
    iv.close_step(None)
    iv.poll()
    assert got == [(None, 0.25)]


def test_max_lag_must_be_a_step_or_more() -> None:
    with pytest.raises(ValueError, match="max_lag"):
        Intervals(FakeStream().event, lambda t, s: None, max_lag=0)


# ----- the Reporter's side: a late comm wait lands on its own step -----------------------------------------
def _reporter() -> tuple[Reporter, FakeClock, FakeTransport]:
    clock, transport = FakeClock(100.0), FakeTransport()
    rep = Reporter(job="j", rank=0, world_size=1, node="n", gpu_uuid=GPU, clock=clock, transport=transport,
                   push_interval_s=3600)
    return rep, clock, transport


def _records(rep: Reporter) -> list[tuple]:
    return list(rep._q)


def test_a_late_comm_wait_lands_on_its_own_step_and_holds_the_later_ones_in_order() -> None:
    rep, clock, _ = _reporter()
    tickets = []
    for _ in range(3):
        tickets.append(rep.defer_comm_wait())
        clock.advance(1.0)
        rep.step_end()
    assert _records(rep) == [] and rep.stats.queue_len == 3  # held, not lost
    rep.resolve_comm_wait(tickets[1], 0.5)
    assert _records(rep) == []  # step 0 is still waiting: order kept
    rep.resolve_comm_wait(tickets[0], 0.25)
    assert [(r[0], r[5]) for r in _records(rep)] == [(0, 0.25), (1, 0.5)]
    rep.resolve_comm_wait(tickets[2], 0.125)
    assert [(r[0], r[5]) for r in _records(rep)][2:] == [(2, 0.125)]
    assert rep.stats.comm_waits_dropped == 0 and rep.stats.dropped_steps == 0
    rep.close()


def test_a_step_without_late_wait_behind_a_held_one_waits_too_and_keeps_its_own_comm() -> None:
    rep, clock, _ = _reporter()
    t0 = rep.defer_comm_wait()
    rep.step_end()
    with rep.comm_wait():
        clock.advance(0.5)
    rep.step_end()  # measured on the host, not deferred
    assert _records(rep) == []
    rep.resolve_comm_wait(t0, 0.25)
    assert [len(r) for r in _records(rep)] == [6, 6] and _records(rep)[1][5] == 0.5


def test_an_unmeasured_late_wait_sends_the_step_without_one_and_counts_it() -> None:
    rep, _, _ = _reporter()
    t0 = rep.defer_comm_wait()
    rep.step_end()
    rep.resolve_comm_wait(t0, None)
    assert [len(r) for r in _records(rep)] == [5] and rep.stats.comm_waits_dropped == 1
    rep.resolve_comm_wait(t0, 1.0)  # too late: ignored, not added to another step
    assert [len(r) for r in _records(rep)] == [5]


def test_a_reader_that_falls_behind_costs_comm_waits_never_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reporter_module, "_MAX_HELD", 4)
    rep, _, _ = _reporter()
    tickets = []
    for _ in range(10):
        tickets.append(rep.defer_comm_wait())
        rep.step_end()
    assert len(_records(rep)) == 6 and rep.stats.comm_waits_dropped == 6 and rep.stats.queue_len == 10
    for t in tickets:
        rep.resolve_comm_wait(t, 0.5)
    assert [len(r) for r in _records(rep)] == [5] * 6 + [6] * 4
    assert rep.stats.dropped_steps == 0


def test_two_readings_for_one_step_add_up() -> None:
    rep, _, _ = _reporter()
    a = rep.defer_comm_wait()
    b = rep.defer_comm_wait()  # two synchronised backwards in one `with step()` block
    rep.step_end()
    rep.resolve_comm_wait(a, 0.25)
    assert _records(rep) == []
    rep.resolve_comm_wait(b, 0.5)
    assert _records(rep)[0][5] == 0.75


def test_close_sends_the_held_steps_without_their_wait() -> None:
    rep, _, transport = _reporter()
    rep.defer_comm_wait()
    rep.step_end()
    rep.close()
    assert [s.get("comm_wait_s") for s in transport.steps()] == [None]
    assert rep.stats.comm_waits_dropped == 1 and rep.stats.pushed_steps == 1


def test_a_step_that_raised_takes_its_late_wait_with_it() -> None:
    rep, _, _ = _reporter()
    with pytest.raises(RuntimeError):
        with rep.step():
            t = rep.defer_comm_wait()
            raise RuntimeError("boom")
    rep.step_end()  # the next step is not held for the failed one's reading
    assert [len(r) for r in _records(rep)] == [5]
    rep.resolve_comm_wait(t, 0.5)
    assert [len(r) for r in _records(rep)] == [5]
