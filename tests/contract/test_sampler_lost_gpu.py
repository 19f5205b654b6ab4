"""A lost GPU exports up=0 and its identity, nothing stale: fast, slow-tier and job series alike."""

from __future__ import annotations

from gpumond.agent.sampler import Sampler

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


def test_a_lost_gpu_keeps_no_slow_tier_value_and_gets_them_back_at_the_next_slow_read(make_session):
    sim, session, clock = make_session(gpus=2)
    sim.set_processes(1, [4242])
    sampler = Sampler(session, hostname="n", jobs=FixedJobs(), timer=lambda: 0.0, clock=lambda: 0.0)
    sampler.slow_cycle()
    sampler.fast_cycle()
    before = exported(sampler, "1")
    assert all(name in before for name in SLOW_METRICS) and "gpumond_gpu_job_info" in before

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
    # slow-tier values from before the loss are not shown again: they return with the next slow read
    assert not any(name in back for name in SLOW_METRICS)
    sampler.slow_cycle()
    sampler.fast_cycle()
    assert all(name in exported(sampler, "1") for name in SLOW_METRICS)
