"""The NVML retry schedules, on the session's and the watcher's injected clock: when each retry comes."""

from __future__ import annotations

import pytest

from gpumond.nvml.events import XidWatcher
from gpumond.nvml.session import NvmlSession
from gpumond.nvml.sim import ManualClock, SimulatedNvml


def first_up_second(driver_back_at: int, retry_max_s: float) -> int | None:
    """The second (read every second) at which a session whose NVML init fails until `driver_back_at` is up."""
    clock = ManualClock()
    sim = SimulatedNvml(gpu_count=1, node="n", clock=clock, init_error="unknown")
    session = NvmlSession(install=sim.install, clock=clock.now, retry_max_s=retry_max_s)
    try:
        session.open()  # the first attempt, at 0 s
        for second in range(1, 200):
            clock.advance(1)
            if second == driver_back_at:
                sim.init_error_code = 0
            if session.read("fast").nvml_up:
                return second
        return None
    finally:
        session.close()
        sim.uninstall()


# Attempts at 0, 2, 6, 14, 30, 62 s (2 s doubling), then every retry_max_s (40 here): 102.
@pytest.mark.parametrize("back_at, up_at", [(1, 2), (3, 6), (7, 14), (15, 30), (31, 62), (63, 102)])
def test_nvml_init_is_retried_after_2_s_doubling_up_to_retry_max_s(back_at, up_at):
    assert first_up_second(back_at, retry_max_s=40) == up_at


# Lost from 0 s, seen lost by the read at 1 s: probed at 3, 7, 15 s (2 s doubling), then every 8 s: 23, 31, 39.
@pytest.mark.parametrize("back_at, up_at", [(2, 3), (5, 7), (10, 15), (20, 23), (25, 31), (32, 39)])
def test_a_lost_gpu_is_probed_after_2_4_8_then_every_8_s(make_session, back_at, up_at):
    sim, s, clock = make_session(gpus=2)
    s.read("fast")
    sim.inject({"kind": "lost", "gpu": 1, "duration_s": back_at})
    up = None
    for second in range(1, 60):
        clock.advance(1)
        if s.read("fast").gpus[1].up:
            up = second
            break
    assert up == up_at


def test_a_refused_xid_registration_is_asked_again_after_10_s_doubling_to_60(make_session):
    sim, s, clock = make_session(gpus=2)
    sim.inject({"kind": "nvml_error", "gpu": 1, "function": "nvmlDeviceRegisterEvents", "error": "not_supported",
                "count": 4})
    w = XidWatcher(s.handles, s.index_of_handle, ready=lambda: s.up, clock=clock.now)
    attempts = []
    try:
        for second in range(200):  # the watcher thread's registration pass, driven by hand once a second
            calls = sim.gpus[1].device_calls
            w._register()  # noqa: SLF001 - the pass whose schedule is under test, without the thread's waits
            if sim.gpus[1].device_calls != calls:
                attempts.append(second)
            if 1 in w._registered:  # noqa: SLF001
                break
            clock.advance(1)
    finally:
        w.stop()
    # refused at 0, 10, 30, 70 s (back-off 10, 20, 40), registered at 130 s (60 s: the cap)
    assert attempts == [0, 10, 30, 70, 130]


def test_a_failing_xid_watcher_restarts_after_1_s_doubling_to_60_and_afresh_once_it_ran(make_session):
    sim, s, _ = make_session(gpus=1)
    sim.inject({"kind": "nvml_error", "function": "nvmlEventSetCreate", "error": "unknown", "count": 8})
    # then it runs, and its first wait fails: a restart after a good run starts the back-off afresh
    sim.inject({"kind": "nvml_error", "function": "nvmlEventSetWait_v2", "error": "unknown", "count": 1})
    pauses = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 9:
            w.stop()

    w = XidWatcher(s.handles, s.index_of_handle, wait_ms=10, ready=lambda: s.up, pause=pause)
    w._run()  # noqa: SLF001 - the watcher thread's loop, run here so that its pauses are recorded, not slept
    assert pauses == [1, 2, 4, 8, 16, 32, 60, 60, 1]
