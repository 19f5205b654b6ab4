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


def test_a_gpu_whose_registration_fails_is_retried_with_backoff_and_fails_the_collector(make_session, caplog):
    import logging

    from tests.agent_sampler import node_sampler

    caplog.set_level(logging.INFO, logger="gpumond.nvml.xid")
    sim, s, clock = make_session(gpus=2)
    sim.inject({"kind": "nvml_error", "gpu": 1, "function": "nvmlDeviceRegisterEvents",
                "error": "not_supported", "count": 2})
    w = XidWatcher(s.handles, s.index_of_handle, wait_ms=20, ready=lambda: s.up, clock=clock.now)
    w.start()
    try:
        calls = sim.gpus[1].device_calls
        time.sleep(0.3)  # ~15 waits: not one more registration attempt inside the back-off
        assert sim.gpus[1].device_calls == calls
        assert not w.healthy and w.error == "xid registration failed on gpu 1 (not_supported)"
        sampler = node_sampler(s, hostname="n", xid=w)
        sampler.fast_cycle()
        assert 'gpumond_collector_success{collector="xid"} 0' in sampler.latest.plain.decode()
        calls = sim.gpus[1].device_calls  # the sampler's reads made calls too
        clock.advance(10)  # asked again at 10 s, refused again: next in 20 s
        assert wait_until(lambda: sim.gpus[1].device_calls > calls)
        assert not w.healthy
        clock.advance(20)
        assert wait_until(lambda: w.healthy), w.error
        sim.inject({"kind": "xid", "gpu": 1, "code": 48})
        assert wait_until(lambda: w.counts().get((1, 48)) == 1), w.counts()
        sampler.fast_cycle()
        assert 'gpumond_collector_success{collector="xid"} 1' in sampler.latest.plain.decode()
    finally:
        w.stop()
    failed = [r for r in caplog.records if r.getMessage().startswith("xid registration failed")]
    assert len(failed) == 1 and failed[0].gpu == 1  # said once, not on every retry
    assert any(r.getMessage() == "xid events registered" and r.gpu == 1 for r in caplog.records)
