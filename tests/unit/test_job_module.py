"""Module-level convenience: gpumond.job.init / wrap / step_end / step / close on a default reporter."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

import gpumond.job as job
from tests.fakes import FakeTransport

GPU = "GPU-11111111-1111-1111-1111-111111111111"


@pytest.fixture(autouse=True)
def no_default(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("GPUMOND_ENDPOINT", raising=False)
    monkeypatch.setattr(job, "_default", None)
    yield
    job.close(timeout_s=1)


def test_init_sets_the_default_that_wrap_and_step_end_use() -> None:
    transport = FakeTransport()
    rep = job.init(job="j", gpu_uuid=GPU, transport=transport, push_interval_s=3600)
    assert job.get_reporter() is rep
    for _ in job.wrap(range(3)):
        pass
    job.step_end(samples=4)
    with job.step():
        pass
    job.close()
    assert [s["step"] for s in transport.steps()] == [0, 1, 2, 3, 4]  # three fetched, one step_end, one block


def test_comm_wait_and_step_end_comm_wait_s_use_the_default_reporter() -> None:
    transport = FakeTransport()
    job.init(job="j", gpu_uuid=GPU, transport=transport, push_interval_s=3600)
    with job.comm_wait():
        pass
    job.step_end()
    job.step_end(comm_wait_s=0)
    job.close()
    steps = transport.steps()
    assert 0 <= steps[0]["comm_wait_s"] <= steps[0]["duration_s"] and steps[1]["comm_wait_s"] == 0.0


def test_init_again_closes_the_previous_default() -> None:
    first, second = FakeTransport(), FakeTransport()
    old = job.init(job="j", gpu_uuid=GPU, transport=first, push_interval_s=3600)
    job.step_end()
    new = job.init(job="j", gpu_uuid=GPU, transport=second, push_interval_s=3600)
    assert not old.enabled and new.enabled and [s["step"] for s in first.steps()] == [0]


def test_wrap_without_init_uses_the_environment_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gpumond.job")
    assert list(job.wrap([1, 2, 3])) == [1, 2, 3]  # no GPUMOND_ENDPOINT: disabled, one warning
    job.step_end()
    assert not job.get_reporter().enabled
    assert len(caplog.records) == 1
