"""XID events through nvmlEventSetWait_v2 on the real pynvml: counted per (gpu, code), thread isolated."""

import time

from gpumond.nvml.events import XidWatcher


def wait_until(pred, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_xids_are_counted_by_gpu_and_code_never_overwritten(make_session):
    sim, s, _ = make_session(gpus=3)
    seen = []
    w = XidWatcher(s.handles, s.index_of_handle, wait_ms=50, on_xid=lambda g, x: seen.append((g, x)))
    w.start()
    try:
        assert w.healthy
        for fault in ({"kind": "xid", "gpu": 1, "code": 48}, {"kind": "xid", "gpu": 2, "code": 13},
                      {"kind": "xid", "gpu": 2, "code": 13}, {"kind": "xid", "gpu": 2, "code": 31}):
            sim.inject(fault)
        assert wait_until(lambda: sum(w.counts().values()) == 4), w.counts()
        assert w.counts() == {(1, 48): 1, (2, 13): 2, (2, 31): 1}
        assert sorted(seen) == [(1, 48), (2, 13), (2, 13), (2, 31)]
    finally:
        w.stop()
    assert not w._thread.is_alive()


def test_a_lost_gpu_reports_xid_79_and_the_watcher_survives(make_session):
    sim, s, _ = make_session(gpus=2)
    w = XidWatcher(s.handles, s.index_of_handle, wait_ms=50)
    w.start()
    try:
        sim.inject({"kind": "lost", "gpu": 0})
        assert wait_until(lambda: w.counts().get((0, 79)) == 1), w.counts()
        sim.inject({"kind": "xid", "gpu": 1, "code": 94})
        assert wait_until(lambda: w.counts().get((1, 94)) == 1), w.counts()
        assert w.healthy
    finally:
        w.stop()


def test_stop_returns_within_one_wait(make_session):
    _, s, _ = make_session(gpus=1)
    w = XidWatcher(s.handles, s.index_of_handle, wait_ms=200)
    w.start()
    t = time.monotonic()
    w.stop()
    assert time.monotonic() - t < 2.0


def test_the_watcher_starts_when_nvml_comes_up_after_agent_start(make_session):
    sim, s, clock = make_session(gpus=2, init_error="driver_not_loaded")
    assert not s.up
    w = XidWatcher(s.handles, s.index_of_handle, wait_ms=50, ready=lambda: s.up)
    w.start()  # NVML down: the watcher waits instead of never starting
    try:
        assert not w.healthy and w.error == "nvml_down"
        sim.init_error_code = 0  # the driver is loaded
        clock.advance(60)
        assert s.read("fast").nvml_up
        assert wait_until(lambda: w.healthy, timeout_s=5.0), w.error
        sim.inject({"kind": "xid", "gpu": 1, "code": 48})
        assert wait_until(lambda: w.counts().get((1, 48)) == 1), w.counts()
    finally:
        w.stop()


def test_a_gpu_that_comes_back_is_registered_again(make_session):
    sim, s, clock = make_session(gpus=2)
    w = XidWatcher(s.handles, s.index_of_handle, wait_ms=50, ready=lambda: s.up)
    w.start()
    try:
        sim.inject({"kind": "lost", "gpu": 0, "duration_s": 5})
        s.read("fast")
        clock.advance(20)
        for _ in range(3):
            s.read("fast")
            clock.advance(8)
        assert s.read("fast").gpus[0].up
        time.sleep(0.3)  # a few waits: the watcher sees the new handle
        sim.inject({"kind": "xid", "gpu": 0, "code": 48})
        assert wait_until(lambda: w.counts().get((0, 48)) == 1), w.counts()
    finally:
        w.stop()
