"""A lost GPU exports up=0 and its identity, nothing stale: fast, slow-tier and job series alike."""

from __future__ import annotations

from gpumond.agent.sampler import Sampler
from tests.agent_sampler import node_sampler

SLOW_METRICS = ("gpumond_gpu_ecc_errors_total", "gpumond_gpu_remapped_rows", "gpumond_gpu_row_remap_pending",
                "gpumond_gpu_temperature_threshold_celsius", "gpumond_gpu_power_limit_default_watts")


def exported(sampler: Sampler, gpu: str) -> dict[str, float]:
    """metric name → value of the series of GPU `gpu` in what /metrics serves now."""
    out = {}
    for line in sampler.latest.plain.decode().splitlines():
        if line.startswith("#") or f'gpu="{gpu}"' not in line:
            continue
        out[line.split("{", 1)[0]] = float(line.rsplit(" ", 1)[1])
    return out


class FixedJobs:
    def jobs_for(self, pids):
        return ("job-a",) if pids else ()


def test_a_lost_gpu_keeps_no_slow_tier_value_and_gets_fresh_ones_as_soon_as_it_is_back(make_session):
    sim, session, clock = make_session(gpus=2)
    sim.set_processes(1, [4242])
    sim.inject({"kind": "ecc_uncorrected", "gpu": 1, "count": 2})  # a row remap pending until a reset
    sampler = node_sampler(session, hostname="n", jobs=FixedJobs(), timer=lambda: 0.0, clock=lambda: 0.0)
    sampler.slow_cycle()
    sampler.fast_cycle()
    before = exported(sampler, "1")
    assert all(name in before for name in SLOW_METRICS) and "gpumond_gpu_job_info" in before
    assert before["gpumond_gpu_row_remap_pending"] == 1.0

    sim.inject({"kind": "lost", "gpu": 1, "duration_s": 10})
    clock.advance(1)
    sampler.fast_cycle()  # the first fast cycle after the loss; no slow cycle has run since
    lost = exported(sampler, "1")
    assert lost == {"gpumond_gpu_up": 0.0, "gpumond_gpu_info": 1.0}, lost
    assert all(name in exported(sampler, "0") for name in SLOW_METRICS)  # its peer untouched

    clock.advance(20)  # the fault is over; the lost-GPU probe finds it on the next fast read
    for _ in range(2):
        sampler.fast_cycle()
        clock.advance(8)
    back = exported(sampler, "1")
    assert back["gpumond_gpu_up"] == 1.0 and "gpumond_gpu_temperature_celsius" in back
    # No scheduled slow cycle has run: the fast cycle that found it back took a fresh slow read at once, so the
    # policy's views (and alerts on remaps, ECC, limits) never see the GPU without them. Fresh, not the values
    # from before the loss: the reset applied the pending remap.
    assert all(name in back for name in SLOW_METRICS), back
    assert back["gpumond_gpu_row_remap_pending"] == 0.0
    assert sampler.slow_read is not None and sampler.slow_read.gpus[1].up


class RecordingPolicy:
    """The policy's side of the sampler: keeps the views of every cycle."""

    def __init__(self) -> None:
        self.views = []

    def cycle(self, views, xids):
        self.views.append(views)
        return []


def test_when_nvml_comes_up_the_policy_never_sees_gpus_without_their_slow_tier(make_session):
    # An agent started before the driver was loaded took its first slow read with NVML down. Without slow-tier
    # values a pending row remap reads as "not pending": its alert (restored from before the restart) would
    # resolve and page again as a new alert at the next scheduled slow cycle, up to 30 s later.
    sim, session, clock = make_session(gpus=2, init_error="driver_not_loaded")
    sim.inject({"kind": "ecc_uncorrected", "gpu": 1, "count": 1})
    policy = RecordingPolicy()
    sampler = node_sampler(session, hostname="n", policy=policy, timer=lambda: 0.0, clock=lambda: 0.0)
    sampler.slow_cycle()
    sampler.fast_cycle()
    assert not session.up and policy.views == []  # no policy cycle on nothing

    sim.init_error_code = 0  # the driver is loaded
    for _ in range(10):  # bounded: the session re-initialises after its back-off
        clock.advance(5)
        sampler.fast_cycle()
        if session.up:
            break
    assert session.up and len(policy.views) == 1
    views = policy.views[0]  # the very first policy cycle with NVML up
    assert all(v.up for v in views)
    assert views[1].remap_pending is True and views[1].limit_default_w is not None
