"""gpumond.job.torch's CUDA path on real DDP and FSDP2 (gloo, CPU, one rank), with only the CUDA events faked.

The timer, the autograd hooks, the deferral and the Reporter are the real ones; the events are
tests/unit/fake_gpu.py's, stamped with the host clock and completing only when the test moves the fake
GPU on. So: what the CUDA path does when the GPU is behind, when it keeps up, and what it never does
(wait). Plus the handle `instrument()` returns, and the setups that must report nothing.
"""

from __future__ import annotations

import logging
import math
import time

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import gpumond.job.torch  # noqa: E402
from gpumond.job import Reporter  # noqa: E402
from gpumond.job.torch import BackwardTimer, CudaEvent, FsdpTimer, StepTiming, StepWait  # noqa: E402
from tests.fakes import FakeTransport  # noqa: E402
from tests.unit.fake_gpu import FakeStream  # noqa: E402

GPU = "GPU-00000000-0000-4000-8000-000000000001"


def _reporter() -> Reporter:
    return Reporter(transport=FakeTransport(), job="x", gpu_uuid=GPU, push_interval_s=3600)


def _ddp() -> nn.Module:
    torch.manual_seed(0)
    return nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))


def _train(model: nn.Module, rep: Reporter, steps: int, between=lambda: None) -> None:
    x = torch.randn(4, 8)
    for _ in rep.wrap(range(steps)):
        model(x).sum().backward()
        between()


def _comm(rep: Reporter) -> list[float | None]:
    return [r[5] if len(r) > 5 else None for r in rep._q]


def test_a_gpu_that_never_catches_up_costs_comm_waits_counted_never_a_blocked_step(one_rank_group) -> None:
    model, rep, stream = _ddp(), _reporter(), FakeStream(at=time.monotonic)
    BackwardTimer(model, StepTiming(rep, stream.event, deferred=True, max_lag=3))
    t0 = time.monotonic()
    _train(model, rep, 10)
    assert time.monotonic() - t0 < 30  # a timer that waited for the frozen GPU would never return
    assert stream.queries > 0  # it asked, and moved on
    # Step n is given up at the backward of step n+4 (3 steps of lag allowed): steps 0-5 go out without.
    assert rep.stats.comm_waits_dropped == 6 and _comm(rep) == [None] * 6
    assert rep.stats.queue_len == 10 and rep.stats.dropped_steps == 0  # steps 6-9 are held, none lost
    rep.close()
    assert rep.stats.comm_waits_dropped == 10  # the ones still in flight at the end: sent without


def test_a_gpu_that_keeps_up_gives_every_step_its_own_wait_one_step_later(one_rank_group) -> None:
    model, rep, stream = _ddp(), _reporter(), FakeStream(at=time.monotonic)
    seen: list[StepWait] = []
    BackwardTimer(model, StepTiming(rep, stream.event, deferred=True, on_step=seen.append, max_lag=3))
    _train(model, rep, 8, between=lambda: stream.reach(math.inf))
    # Each step's events are read at the next backward; the last step's wait is still in flight.
    assert len(seen) == 7 and all(w.exposed_s >= 0 for w in seen)
    assert _comm(rep) == pytest.approx([w.exposed_s for w in seen], abs=1e-12)
    assert rep.stats.comm_waits_dropped == 0


def test_no_sync_backwards_defer_nothing(one_rank_group) -> None:
    model, rep, stream = _ddp(), _reporter(), FakeStream(at=time.monotonic)
    BackwardTimer(model, StepTiming(rep, stream.event, deferred=True))
    x = torch.randn(4, 8)
    with model.no_sync():
        for _ in range(3):
            model(x).sum().backward()
            rep.step_end()
    assert stream.created == 0 and rep._held == type(rep._held)() and len(rep._q) == 3


def test_instrument_returns_a_handle_that_undoes_it(one_rank_group) -> None:
    model, rep = _ddp(), _reporter()
    handle = gpumond.job.torch.instrument(model, rep)
    assert handle.reporter is rep and handle.timing and handle.stats == rep.stats  # the reporter's, passed on
    _train(model, rep, 2)
    handle.remove()
    _train(model, rep, 2)
    assert [c is not None for c in _comm(rep)] == [True, True, False, False]
    assert not handle.timing
    handle.remove()  # idempotent


def test_a_removed_comm_hook_keeps_reducing_untimed(one_rank_group) -> None:
    model, rep = _ddp(), _reporter()
    handle = gpumond.job.torch.instrument(model, rep, via="hook")
    _train(model, rep, 1)
    handle.remove()
    _train(model, rep, 1)
    assert [c is not None for c in _comm(rep)] == [True, False]


def test_a_model_spread_over_devices_in_one_process_reports_nothing(one_rank_group, caplog) -> None:
    model, rep = _ddp(), _reporter()
    model.module[2].to("meta")  # a second device in this process (DDP cannot train it; instrument must not guess)
    with caplog.at_level(logging.WARNING, logger="gpumond.job"):
        handle = gpumond.job.torch.instrument(model, rep)
    assert not handle.timing and "several devices" in caplog.text


def test_instrument_rejects_a_bad_max_lag() -> None:
    with pytest.raises(ValueError, match="max_lag"):
        gpumond.job.torch.instrument(nn.parallel.DistributedDataParallel.__new__(nn.parallel.DistributedDataParallel),
                                     _reporter(), max_lag=0)


def _fsdp() -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    net = nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.ReLU()), nn.Sequential(nn.Linear(16, 16), nn.ReLU()),
                        nn.Linear(16, 1))
    for block in list(net)[:2]:
        fully_shard(block)
    return fully_shard(net)


def test_fsdp2_training_forwards_report_their_all_gather_wait_and_evaluation_does_not(one_rank_group) -> None:
    model, rep = _fsdp(), _reporter()
    seen: list[StepWait] = []
    handle = gpumond.job.torch.instrument(model, rep, on_step=seen.append)
    assert handle.timing
    _train(model, rep, 3)
    with torch.no_grad():
        model(torch.randn(4, 8))
    assert len(seen) == 3 and all(w.exposed_s >= 0 for w in seen)
    assert _comm(rep) == pytest.approx([w.exposed_s for w in seen], abs=1e-12)
    handle.remove()
    _train(model, rep, 1)
    assert len(seen) == 3


def test_fsdp2_on_the_deferred_path_sums_one_interval_per_sharded_module(one_rank_group) -> None:
    ticks = iter(range(1_000_000))
    model, rep, stream = _fsdp(), _reporter(), FakeStream(at=lambda: float(next(ticks)))
    timer = FsdpTimer(model, StepTiming(rep, stream.event, deferred=True))
    x = torch.randn(4, 8)
    for _ in range(2):
        model(x).sum().backward()
        rep.step_end()
    assert _comm(rep) == []  # held: the fake GPU has not run them
    stream.reach(math.inf)
    model(x).sum().backward()  # its forward reads the two earlier steps
    rep.step_end()
    # Every record is one tick later than the one before: each FSDP module's interval (root + 2 blocks) is 1.
    assert _comm(rep) == [3.0, 3.0]
    timer.remove()


def test_instrument_refuses_via_hook_for_fsdp2(one_rank_group) -> None:
    with pytest.raises(ValueError, match="for DDP"):
        gpumond.job.torch.instrument(_fsdp(), _reporter(), via="hook")


class _SpyCudaEvent:
    """torch.cuda.Event's surface, logging what is called; waiting on it fails the test."""

    def __init__(self, log: list[str], done: bool) -> None:
        self.log, self.done = log, done

    def record(self, stream: object = None) -> None:
        self.log.append("record")

    def query(self) -> bool:
        self.log.append("query")
        return self.done

    def elapsed_time(self, end: _SpyCudaEvent) -> float:
        self.log.append("elapsed_time")
        return 250.0  # milliseconds, as torch gives them

    def synchronize(self) -> None:
        raise AssertionError("the training thread must never wait for the GPU")

    wait = synchronize


def test_the_cuda_event_records_queries_and_reads_milliseconds_as_seconds_and_never_waits() -> None:
    log: list[str] = []
    start, end = CudaEvent(_SpyCudaEvent(log, True)), CudaEvent(_SpyCudaEvent(log, True))
    start.record()
    end.record()
    assert start.query() and end.query()
    assert start.elapsed_s(end) == 0.25
    assert log == ["record", "record", "query", "query", "elapsed_time"]
