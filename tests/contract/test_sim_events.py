"""XID delivery through nvmlEventSetWait_v2: right device handle and code, timeouts in wall
milliseconds, and scenario XIDs noticed by a waiting caller alone."""

from __future__ import annotations

import ctypes
import threading
import time

import pynvml
import pytest

from gpumond.nvml.sim import Fault, ManualClock, Scenario, SimClock

XID = pynvml.nvmlEventTypeXidCriticalError


@pytest.fixture
def make(make_sim):
    return make_sim


def address(handle):
    return ctypes.cast(handle, ctypes.c_void_p).value


def listen(*indexes, types=XID):
    event_set = pynvml.nvmlEventSetCreate()
    for i in indexes:
        pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(i), types, event_set)
    return event_set


def test_injected_xid_arrives_with_device_and_code(make):
    sim = make()
    event_set = listen(0, 1)
    sim.inject(Fault(gpu=1, kind="xid", code=48))
    data = pynvml.nvmlEventSetWait_v2(event_set, 100)
    assert data.eventType == XID
    assert data.eventData == 48
    assert address(data.device) == address(pynvml.nvmlDeviceGetHandleByIndex(1))
    assert pynvml.nvmlDeviceGetIndex(data.device) == 1  # the handle is usable as is
    assert sim.gpu_for(data.device).xid_counts == {48: 1}
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 0)  # consumed; nothing else pending
    pynvml.nvmlEventSetFree(event_set)


def test_timeout_blocks_for_wall_milliseconds(make):
    make()
    event_set = listen(0)
    start = time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 80)
    assert 0.07 <= time.monotonic() - start < 1.0


def test_unregistered_gpu_and_earlier_events_are_not_delivered(make):
    sim = make()
    sim.inject(Fault(gpu=0, kind="xid", code=31))  # before anyone listened
    event_set = listen(0)
    sim.inject(Fault(gpu=2, kind="xid", code=13))  # a GPU this set did not register
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 10)
    sim.inject(Fault(gpu=0, kind="xid", code=43, count=2))
    assert [pynvml.nvmlEventSetWait_v2(event_set, 10).eventData for _ in range(2)] == [43, 43]


def test_scenario_xid_is_noticed_by_the_waiter_alone(make):
    # At 20× speed the XID at 1 s simulated is due after 50 ms of wall time; only the
    # blocked wait is running, so it must wake on its own to see it.
    scenario = Scenario.model_validate({"faults": [{"gpu": 2, "kind": "xid", "at_s": 1.0, "code": 94}]})
    make(scenario=scenario, clock=SimClock(speed=20.0))
    event_set = listen(0, 1, 2)
    start = time.monotonic()
    data = pynvml.nvmlEventSetWait_v2(event_set, 5000)
    assert data.eventData == 94
    assert 0.03 < time.monotonic() - start < 1.0


def test_manual_clock_advanced_while_waiting(make):
    clock = ManualClock()
    sim = make(clock=clock)
    sim.inject(Fault(gpu=0, kind="xid", code=63, at_s=30))  # 30 simulated s from now
    event_set = listen(0)
    timer = threading.Timer(0.05, clock.advance, args=(31.0,))
    timer.start()
    try:
        assert pynvml.nvmlEventSetWait_v2(event_set, 3000).eventData == 63
    finally:
        timer.cancel()


def test_lost_gpu_queues_xid_79_first(make):
    sim = make()
    event_set = listen(0, 1)
    sim.inject(Fault(gpu=1, kind="lost"))
    data = pynvml.nvmlEventSetWait_v2(event_set, 100)
    assert (data.eventData, address(data.device)) == (79, address(sim.gpus[1].handle))
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetIndex(data.device)


def test_ecc_events_for_sets_that_asked(make):
    sim = make()
    event_set = listen(0, types=XID | pynvml.nvmlEventTypeDoubleBitEccError)
    sim.inject(Fault(gpu=0, kind="ecc_uncorrected"))
    assert pynvml.nvmlEventSetWait_v2(event_set, 100).eventType == pynvml.nvmlEventTypeDoubleBitEccError


def test_freed_set_is_invalid(make):
    make()
    event_set = listen(0)
    pynvml.nvmlEventSetFree(event_set)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlEventSetWait_v2(event_set, 10)
