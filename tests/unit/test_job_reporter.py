"""The Reporter on a fake clock and a fake transport: step boundaries, timing, payload, overflow, failure."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest

from gpumond.job import Reporter, Stats
from gpumond.job import reporter as reporter_module
from gpumond.job.transport import Reply
from tests.fakes import FakeClock, FakeTransport

ENV_VARS = ("GPUMOND_ENDPOINT", "GPUMOND_TOKEN", "GPUMOND_TOKEN_FILE", "GPUMOND_JOB_ID", "GPUMOND_GROUP",
            "GPUMOND_GPU_UUID", "GPUMOND_NODE", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
            "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES")
WALL_OFFSET = 1_763_760_000.0
GPU = "GPU-abcabcab-0000-4000-8000-0000000000ab"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def make(clock: FakeClock | None = None, **kwargs: object) -> Reporter:
    """A reporter that only pushes when closed (a long interval), by default onto a fake transport."""
    clock = clock or FakeClock(100.0)
    args: dict[str, object] = dict(job="job-1", rank=1, world_size=4, node="node-a", gpu_uuid=GPU,
                                   push_interval_s=3600.0, clock=clock, wall=lambda: clock.now + WALL_OFFSET,
                                   transport=FakeTransport())
    args.update(kwargs)
    return Reporter(**args)  # type: ignore[arg-type]


def loader(clock: FakeClock, waits: list[float]) -> Iterator[int]:
    """A data loader whose every batch keeps the caller blocked for waits[i] (fake) seconds."""
    for i, wait in enumerate(waits):
        clock.advance(wait)
        yield i


def pushed(rep: Reporter, transport: FakeTransport) -> list[tuple]:
    """Close the reporter and return (step, duration_s, data_wait_s, samples) of everything pushed."""
    rep.close(timeout_s=5)
    return [(s["step"], s["duration_s"], s["data_wait_s"], s["samples"]) for s in transport.steps()]


# ----- step boundaries and timing -----------------------------------------------------------------
def test_implicit_steps_span_consecutive_fetches() -> None:
    clock, transport = FakeClock(100.0), FakeTransport()
    rep = make(clock, transport=transport)
    for i in rep.wrap(loader(clock, [0.5, 0.25, 0.125])):
        clock.advance(1.0 + i)  # compute
    # Step i = its fetch + its compute; the last one ends when the exhausted loader is asked again.
    assert pushed(rep, transport) == [(0, 1.5, 0.5, None), (1, 2.25, 0.25, None), (2, 3.125, 0.125, None)]


def test_explicit_step_end_closes_the_step_and_the_gap_belongs_to_no_step() -> None:
    clock, transport = FakeClock(100.0), FakeTransport()
    rep = make(clock, transport=transport)
    for _ in rep.wrap(loader(clock, [0.5, 0.5])):
        clock.advance(1.0)
        rep.step_end(samples=32)
        clock.advance(7.0)  # logging, checkpointing: outside any step
    assert pushed(rep, transport) == [(0, 1.5, 0.5, 32), (1, 1.5, 0.5, 32)]


def test_step_end_without_wrap_measures_from_the_previous_end() -> None:
    clock, transport = FakeClock(100.0), FakeTransport()
    rep = make(clock, transport=transport)
    clock.advance(2.0)  # from the reporter's creation
    rep.step_end()
    clock.advance(0.75)
    rep.step_end(samples=8)
    assert pushed(rep, transport) == [(0, 2.0, 0.0, None), (1, 0.75, 0.0, 8)]


def test_step_block_groups_fetches_for_gradient_accumulation() -> None:
    clock, transport = FakeClock(100.0), FakeTransport()
    rep = make(clock, transport=transport)
    batches = rep.wrap(loader(clock, [0.1] * 8))
    for _ in range(2):
        with rep.step(samples=4 * 16):
            for _ in range(4):
                next(batches)
                clock.advance(0.5)
    assert pushed(rep, transport) == [(0, 2.4, 0.4, 64), (1, 2.4, 0.4, 64)]


def test_step_block_adopts_the_batch_fetched_just_before_it() -> None:
    clock, transport = FakeClock(100.0), FakeTransport()
    rep = make(clock, transport=transport)
    for _ in rep.wrap(loader(clock, [0.5, 0.5])):
        with rep.step():
            clock.advance(1.0)
        clock.advance(3.0)  # after the block: not part of the step
    assert pushed(rep, transport) == [(0, 1.5, 0.5, None), (1, 1.5, 0.5, None)]


def test_nested_blocks_are_one_step_and_a_raising_block_is_not_a_step() -> None:
    clock, transport = FakeClock(100.0), FakeTransport()
    rep = make(clock, transport=transport)
    with rep.step():
        clock.advance(1.0)
        with rep.step():
            clock.advance(1.0)
    with pytest.raises(RuntimeError), rep.step():
        clock.advance(5.0)
        raise RuntimeError("loss is nan")
    with rep.step():
        clock.advance(0.5)
    assert pushed(rep, transport) == [(0, 2.0, 0.0, None), (1, 0.5, 0.0, None)]


def test_breaking_out_of_the_loop_leaves_the_last_step_unrecorded() -> None:
    clock, transport = FakeClock(100.0), FakeTransport()
    rep = make(clock, transport=transport)
    for i in rep.wrap(loader(clock, [0.5] * 10)):
        clock.advance(1.0)
        if i == 2:
            break
    assert [s[0] for s in pushed(rep, transport)] == [0, 1]


def test_explicit_step_numbers_continue_from_the_given_one() -> None:
    clock, transport = FakeClock(100.0), FakeTransport()
    rep = make(clock, transport=transport)
    rep.step_end(step=1200)
    rep.step_end()
    assert [s[0] for s in pushed(rep, transport)] == [1200, 1201]


def test_int_like_samples_are_converted_and_junk_becomes_null() -> None:
    class IntLike:
        def __int__(self) -> int:
            return 16

    clock, transport = FakeClock(100.0), FakeTransport()
    rep = make(clock, transport=transport)
    rep.step_end(samples=IntLike())  # type: ignore[arg-type]
    rep.step_end(samples="lots")  # type: ignore[arg-type]
    rep.step_end(samples=-3)
    assert [s[3] for s in pushed(rep, transport)] == [16, None, None]


def test_wrap_passes_every_item_and_exception_through() -> None:
    def failing() -> Iterator[int]:
        yield 1
        raise OSError("corrupt shard")

    rep = make()
    it = rep.wrap(failing())
    assert next(it) == 1
    with pytest.raises(OSError, match="corrupt shard"):
        next(it)
    assert list(rep.wrap([1, 2, 3])) == [1, 2, 3]
    rep.close()


# ----- comm wait ----------------------------------------------------------------------------------
def comm_waits(rep: Reporter, transport: FakeTransport) -> list[tuple]:
    """Close the reporter and return (step, duration_s, data_wait_s, comm_wait_s or None) of everything pushed."""
    rep.close(timeout_s=5)
    return [(s["step"], s["duration_s"], s["data_wait_s"], s.get("comm_wait_s")) for s in transport.steps()]


def test_comm_wait_blocks_add_up_within_a_step_and_start_again_at_zero() -> None:
    clock, transport = FakeClock(100.0), FakeTransport()
    rep = make(clock, transport=transport)
    for i in rep.wrap(loader(clock, [0.5, 0.5, 0.5])):
        clock.advance(1.0)  # compute
        with rep.comm_wait():
            clock.advance(0.25 * (i + 1))  # waiting for the other ranks
        clock.advance(0.125)
        with rep.comm_wait():
            clock.advance(0.0625)
    assert comm_waits(rep, transport) == [(0, 1.9375, 0.5, 0.3125), (1, 2.1875, 0.5, 0.5625),
                                          (2, 2.4375, 0.5, 0.8125)]


def test_add_comm_wait_adds_to_the_open_step_and_ignores_what_is_not_a_duration() -> None:
    # What a framework hook hands over (gpumond.job.torch): added like a comm_wait() block, bad values dropped.
    clock, transport = FakeClock(100.0), FakeTransport()
    rep = make(clock, transport=transport)
    for i in rep.wrap(loader(clock, [0.5, 0.5])):
        clock.advance(1.0)
        rep.add_comm_wait(0.25)
        for bad in (-1.0, float("nan"), float("inf"), "x", None):
            rep.add_comm_wait(bad)  # type: ignore[arg-type]
        if i == 1:
            with rep.comm_wait():
                clock.advance(0.125)
    assert comm_waits(rep, transport) == [(0, 1.5, 0.5, 0.25), (1, 1.625, 0.5, 0.375)]


def test_comm_wait_is_omitted_from_steps_that_did_not_measure_it() -> None:
    clock, transport = FakeClock(100.0), FakeTransport()
    rep = make(clock, transport=transport)
    for i in rep.wrap(loader(clock, [0.5, 0.5, 0.5])):
        clock.advance(1.0)
        if i == 1:
            with rep.comm_wait():
                pass  # measured, and zero
        rep.step_end()
    rep.close()
    assert [list(s) for s in transport.steps()] == [
        ["step", "end", "duration_s", "data_wait_s", "samples"],
        ["step", "end", "duration_s", "data_wait_s", "samples", "comm_wait_s"],
        ["step", "end", "duration_s", "data_wait_s", "samples"]]
    assert transport.steps()[1]["comm_wait_s"] == 0.0


def test_step_end_takes_an_explicit_comm_wait_that_replaces_the_measured_one() -> None:
    clock, transport = FakeClock(100.0), FakeTransport()
    rep = make(clock, transport=transport)
    for i in rep.wrap(loader(clock, [0.5, 0.5, 0.5])):
        with rep.comm_wait():
            clock.advance(0.75)
        clock.advance(0.25)
        rep.step_end(comm_wait_s=[0.125, None, 0.0][i])
    # None leaves the measured value; an explicit 0 replaces it.
    assert comm_waits(rep, transport) == [(0, 1.5, 0.5, 0.125), (1, 1.5, 0.5, 0.75), (2, 1.5, 0.5, 0.0)]


def test_explicit_comm_waits_are_converted_and_junk_is_not_measured() -> None:
    class FloatLike:
        def __float__(self) -> float:
            return 0.25

    clock, transport = FakeClock(100.0), FakeTransport()
    rep = make(clock, transport=transport)
    for value in (FloatLike(), 0, "lots", -0.5, float("nan"), float("inf")):
        clock.advance(1.0)
        rep.step_end(comm_wait_s=value)  # type: ignore[arg-type]
    assert rep.enabled
    assert [c for *_, c in comm_waits(rep, transport)] == [0.25, 0.0, None, None, None, None]


def test_comm_wait_between_steps_counts_toward_the_next_one() -> None:
    clock, transport = FakeClock(100.0), FakeTransport()
    rep = make(clock, transport=transport)
    batches = rep.wrap(loader(clock, [0.5, 0.5]))
    next(batches)
    clock.advance(2.0)
    rep.step_end()
    with rep.comm_wait():  # after step_end, before the next fetch: like a fetch there, it goes to the next step
        clock.advance(0.25)
    clock.advance(1.0)
    next(batches)
    clock.advance(2.0)
    rep.step_end()
    with rep.comm_wait():
        clock.advance(0.5)
    with rep.step():  # so does a block opened after it
        clock.advance(1.5)
    assert comm_waits(rep, transport) == [(0, 2.5, 0.5, None), (1, 2.5, 0.5, 0.25), (2, 1.5, 0.0, 0.5)]


def test_comm_wait_is_cut_to_what_the_step_leaves_after_its_data_wait() -> None:
    clock, transport = FakeClock(100.0), FakeTransport()
    rep = make(clock, transport=transport)
    rep.step_end()
    with rep.comm_wait():  # measured between steps, longer than the step it is carried into
        clock.advance(5.0)
    rep.step_end()
    batches = rep.wrap(loader(clock, [0.25]))
    next(batches)
    clock.advance(1.0)
    rep.step_end(comm_wait_s=3.0)  # an explicit value longer than the step
    steps = comm_waits(rep, transport)
    assert steps[1] == (1, 5.0, 0.0, pytest.approx(5.0, abs=2e-6))
    assert steps[2] == (2, 1.25, 0.25, pytest.approx(1.0, abs=2e-6))
    for _, duration, data_wait, comm in steps[1:]:
        assert data_wait + comm <= duration  # the service's rule, without even its 1 µs slack


def test_a_step_that_raised_drops_its_comm_wait_and_nested_blocks_count_once() -> None:
    clock, transport = FakeClock(100.0), FakeTransport()
    rep = make(clock, transport=transport)
    with pytest.raises(TimeoutError), rep.step():
        with rep.comm_wait():
            clock.advance(3.0)
            raise TimeoutError("NCCL watchdog")
    with rep.step():
        with rep.comm_wait():
            clock.advance(0.25)
            with rep.comm_wait():
                clock.advance(0.5)
            clock.advance(0.25)
        clock.advance(1.0)
    assert comm_waits(rep, transport) == [(0, 2.0, 0.0, 1.0)]


def test_comm_wait_is_one_reused_object_and_a_no_op_when_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    rep = make()
    assert rep.comm_wait() is rep.comm_wait()
    rep.close()
    monkeypatch.setattr(reporter_module, "local_gpu_uuid", lambda env: None)
    off = make(gpu_uuid=None)
    assert not off.enabled
    with off.comm_wait():
        off.step_end(comm_wait_s=1.0)
    with pytest.raises(KeyError), off.comm_wait():  # the caller's exceptions pass through
        raise KeyError("x")


def test_a_failing_clock_in_comm_wait_disables_the_reporter_instead_of_raising(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(100.0)
    rep = make(clock)
    caplog.set_level(logging.WARNING, logger="gpumond.job")

    def broken() -> float:
        raise OSError("clock broke")

    rep._clock = broken  # after construction: the reporter's own setup read the clock fine
    with rep.comm_wait():
        pass
    assert not rep.enabled
    assert [r for r in caplog.records if "clock broke" in r.getMessage()]
    rep.close()


# ----- payload ------------------------------------------------------------------------------------
def test_payload_shape_matches_the_push_contract() -> None:
    clock, transport = FakeClock(100.0), FakeTransport()
    rep = make(clock, transport=transport, group="pp-stage-2")
    for _ in rep.wrap(loader(clock, [0.02])):
        clock.advance(0.82)
        rep.step_end(samples=32)
    end = clock.now + WALL_OFFSET
    rep.close()
    body, final = transport.bodies
    assert list(body) == ["job", "rank", "world_size", "node", "gpu_uuid", "group", "incarnation", "steps"]
    # close() ends with the rank's final push: the same head, no steps, "final": true (the end of job).
    assert final == {**{k: v for k, v in body.items() if k != "steps"}, "steps": [], "final": True}
    assert {k: v for k, v in body.items() if k != "steps"} == {
        "job": "job-1", "rank": 1, "world_size": 4, "node": "node-a", "gpu_uuid": GPU,
        "group": "pp-stage-2", "incarnation": rep.incarnation}
    assert re.fullmatch(r"[0-9a-f]+-[0-9a-f]{12}", rep.incarnation or "")
    (step,) = body["steps"]
    assert list(step) == ["step", "end", "duration_s", "data_wait_s", "samples"]
    assert step == {"step": 0, "end": pytest.approx(end), "duration_s": pytest.approx(0.84),
                    "data_wait_s": pytest.approx(0.02), "samples": 32}


def test_labels_are_escaped_as_json() -> None:
    transport = FakeTransport()
    rep = make(transport=transport, job='run "7" \\ ü', group="stage/2")
    rep.step_end()
    rep.close()
    assert (transport.bodies[0]["job"], transport.bodies[0]["group"]) == ('run "7" \\ ü', "stage/2")


def test_group_is_null_when_not_set() -> None:
    transport = FakeTransport()
    rep = make(transport=transport)
    rep.step_end()
    rep.close()
    assert transport.bodies[0]["group"] is None


def test_batches_hold_at_most_max_steps_per_push() -> None:
    transport = FakeTransport()
    rep = make(transport=transport, max_steps_per_push=512)
    for _ in range(1200):
        rep.step_end()
    rep.close()
    assert [len(b["steps"]) for b in transport.bodies] == [512, 512, 176, 0]
    assert rep.stats == Stats(pushed_steps=1200)


# ----- bounded queue ------------------------------------------------------------------------------
def test_queue_overflow_drops_the_oldest_and_counts_them() -> None:
    transport = FakeTransport()
    rep = make(transport=transport, max_queue=5)
    for _ in range(12):
        rep.step_end()
    assert rep.stats == Stats(dropped_steps=7, queue_len=5)
    rep.close()
    assert [s["step"] for s in transport.steps()] == [7, 8, 9, 10, 11]
    assert rep.stats == Stats(pushed_steps=5, dropped_steps=7)


def test_max_queue_bounds_the_queue_and_the_batch_in_hand_together() -> None:
    transport = FakeTransport(Reply(503))
    rep = make(transport=transport, max_queue=20, max_steps_per_push=8)
    for _ in range(20):
        rep.step_end()
    assert rep._pusher is not None
    assert rep._pusher.drain(1.0) is not None  # a push fails: its 8 steps stay in hand, to be retried
    for _ in range(30):  # the outage goes on; training does not
        rep.step_end()
        assert rep.stats.queue_len <= 20
    assert rep.stats == Stats(dropped_steps=30, failed_pushes=1, queue_len=20, last_error="HTTP 503")
    rep.close()
    # The service is back: the batch in hand (the outage's first steps) and the newest queued steps go out.
    assert [s["step"] for s in transport.steps()] == [*range(8), *range(8), *range(38, 50)]
    assert rep.stats == Stats(pushed_steps=20, dropped_steps=30, failed_pushes=1)


def test_stats_is_a_frozen_snapshot() -> None:
    rep = make()
    snap = rep.stats
    rep.step_end()
    assert snap.queue_len == 0 and rep.stats.queue_len == 1
    with pytest.raises(AttributeError):
        snap.queue_len = 3  # type: ignore[misc]
    rep.close()


# ----- lifecycle ----------------------------------------------------------------------------------
def test_close_is_idempotent_and_later_calls_are_no_ops() -> None:
    transport = FakeTransport()
    rep = make(transport=transport)
    rep.step_end()
    rep.close()
    rep.close()
    rep.step_end()
    assert list(rep.wrap([1, 2])) == [1, 2]
    assert not rep.enabled
    assert len(transport.steps()) == 1


def test_reporter_is_a_context_manager() -> None:
    transport = FakeTransport()
    with make(transport=transport) as rep:
        rep.step_end()
    assert not rep.enabled and len(transport.steps()) == 1


def test_close_is_registered_with_atexit_and_unregistered_by_close(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[object] = []
    monkeypatch.setattr(reporter_module.atexit, "register", registered.append)
    monkeypatch.setattr(reporter_module.atexit, "unregister", registered.remove)
    rep = make()
    assert registered == [rep.close]
    rep.close()
    assert registered == []


def test_closing_a_forked_copy_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    transport = FakeTransport()
    rep = make(transport=transport)
    rep.step_end()
    monkeypatch.setattr(reporter_module.os, "getpid", lambda: -1)  # as seen from another process
    rep.close()
    assert transport.bodies == [] and not rep.enabled
    monkeypatch.undo()
    rep._closed = False  # the real process still owns it
    rep.close()
    assert len(transport.steps()) == 1


# ----- misconfiguration: one warning, no exception, no effect -------------------------------------
@pytest.mark.parametrize(("kwargs", "env", "reason"), [
    ({"transport": None}, {}, "no endpoint"),
    ({"transport": None, "endpoint": "http://127.0.0.1:9"}, {}, "no token"),
    ({"transport": None, "endpoint": "ftp://x", "token": "t"}, {}, "http:// or https://"),
    ({"transport": None}, {"GPUMOND_ENDPOINT": "http://h:1", "GPUMOND_TOKEN_FILE": "/nonexistent/t"},
     "cannot read GPUMOND_TOKEN_FILE"),
    ({"job": None}, {}, "no job id"),
    ({"rank": None, "world_size": None}, {"RANK": "x"}, "RANK must be an integer"),
    ({"gpu_uuid": None}, {}, "GPU UUID"),
    ({"max_queue": 0}, {}, "max_queue"),
    ({"push_interval_s": 0}, {}, "push_interval_s"),
    ({"timeout_s": float("nan")}, {}, "timeout_s"),
])
def test_misconfigured_reporter_warns_once_and_does_nothing(
        kwargs: dict[str, object], env: dict[str, str], reason: str,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(reporter_module, "local_gpu_uuid", lambda env: None)  # no GPU on this machine
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    caplog.set_level(logging.WARNING, logger="gpumond.job")
    rep = make(**kwargs)
    assert not rep.enabled
    for _ in rep.wrap(range(3)):
        rep.step_end(samples=1)
    with rep.step():
        pass
    rep.close()
    warnings = [r for r in caplog.records if r.name == "gpumond.job"]
    assert len(warnings) == 1
    assert "training continues" in warnings[0].getMessage() and reason in warnings[0].getMessage()
    assert reason in (rep.stats.last_error or "")
    assert rep.stats.pushed_steps == rep.stats.queue_len == 0


def test_a_failing_clock_disables_the_reporter_instead_of_raising(caplog: pytest.LogCaptureFixture) -> None:
    calls = {"n": 0}

    def clock() -> float:
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError("clock broke")
        return 0.0

    caplog.set_level(logging.WARNING, logger="gpumond.job")
    rep = make(clock=clock)  # type: ignore[arg-type]
    rep.step_end()
    rep.step_end()
    assert list(rep.wrap([1, 2])) == [1, 2]
    assert not rep.enabled
    assert [r.getMessage() for r in caplog.records if "clock broke" in r.getMessage()] != []
    assert len(caplog.records) == 1
    rep.close()


def test_the_token_never_reaches_the_log(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(reporter_module, "local_gpu_uuid", lambda env: None)
    caplog.set_level(logging.DEBUG, logger="gpumond.job")
    rep = make(transport=None, endpoint="http://127.0.0.1:9", token="s3cr3t-token", gpu_uuid=None)
    rep.close()
    assert caplog.records and all("s3cr3t" not in r.getMessage() for r in caplog.records)
