"""Power slack (gpumond/rules/energy/slack.py): the lowest limit under which a waiting GPU still ends its
compute a margin before its slowest peer, from its own measured clock/power points."""

from __future__ import annotations

import pytest

from gpumond.rules.energy.slack import (OperatingPoint, RankTime, job_recommendations, operating_points,
                                        power_for_clock, recommend, target_clock)

MHZ = 1e6
# An H100-like curve measured under four limits: idle 90 W + 610 W · (f/1980)^2.5 (convex).
POINTS = [OperatingPoint(f * MHZ, 90 + 610 * (f / 1980) ** 2.5) for f in (1200, 1500, 1750, 1980)]


def test_the_target_clock_stretches_compute_to_the_slowest_peer_less_the_margin() -> None:
    # 0.8 s of compute at 1980 MHz, the slowest peer computes 1.0 s, 2 % margin: 0.98 s allowed.
    f = target_clock(0.8, 1.0, 1980 * MHZ, 0.02)
    assert 0.8 * 1980 * MHZ / f == pytest.approx(0.98)
    assert target_clock(1.0, 1.0, 1980 * MHZ, 0.02) is None  # the slowest itself
    assert target_clock(0.99, 1.0, 1980 * MHZ, 0.02) is None  # inside the margin
    # Half the compute bound by memory: the same budget allows a lower clock.
    assert target_clock(0.8, 1.0, 1980 * MHZ, 0.02, clock_bound=0.5) < f


def test_power_on_the_chord_is_never_below_the_convex_curve_and_unknown_below_the_points() -> None:
    for f in (1300, 1600, 1900):
        true = 90 + 610 * (f / 1980) ** 2.5
        assert power_for_clock(POINTS, f * MHZ) >= true
        assert power_for_clock(POINTS, f * MHZ) == pytest.approx(true, rel=0.05)
    assert power_for_clock(POINTS, 1100 * MHZ) is None
    assert power_for_clock(POINTS, 2000 * MHZ) == POINTS[-1].power_w


def test_operating_points_average_samples_per_clock_bin() -> None:
    pts = operating_points([(1980e6, 700), (1981e6, 690), (1500e6, 400), (0, 5), (1500e6, -1)])
    assert [(round(p.clock_hz / MHZ), p.power_w) for p in pts] == [(1500, 400), (1980, 695)]


def test_recommend_interpolates_within_measured_points_and_probes_below_them() -> None:
    rec = recommend("g", POINTS, 1980 * MHZ, 0.8, 1.0, margin=0.02, floor_w=200, ceiling_w=700, probe_w=25)
    assert rec is not None and rec.basis == "interpolated"
    assert 90 + 610 * (rec.clock_hz / MHZ / 1980) ** 2.5 <= rec.limit_w < 700
    only_now = [POINTS[-1]]
    probe = recommend("g", only_now, 1980 * MHZ, 0.8, 1.0, margin=0.02, floor_w=200, ceiling_w=700, probe_w=25)
    assert probe is not None and probe.basis == "probe" and probe.limit_w == 700 - 25
    floored = recommend("g", POINTS, 1980 * MHZ, 0.3, 1.0, margin=0.02, floor_w=450, ceiling_w=700, probe_w=25)
    assert floored is not None and floored.limit_w == 450
    assert recommend("g", POINTS, 1980 * MHZ, 0.99, 1.0, margin=0.02, floor_w=200, ceiling_w=700, probe_w=25) is None


def test_a_balanced_job_gets_nothing_and_an_unbalanced_one_only_for_its_waiting_gpus() -> None:
    def job(shares: list[float]) -> list:
        ranks = [RankTime(i, f"g{i}", 1.0, s) for i, s in enumerate(shares)]
        u = [r.gpu_uuid for r in ranks]
        return job_recommendations(ranks, dict.fromkeys(u, POINTS), dict.fromkeys(u, 1980 * MHZ), margin=0.02,
                                   floor_w=dict.fromkeys(u, 200.0), ceiling_w=dict.fromkeys(u, 700.0), probe_w=25)
    assert job([0.9, 0.9, 0.895, 0.9]) == []
    recs = job([0.72, 0.72, 0.9, 0.72])
    assert [r.gpu_uuid for r in recs] == ["g0", "g1", "g3"] and all(r.limit_w < 700 for r in recs)
    assert job([0.5]) == []


def test_a_gpu_at_the_margin_holds_its_limit_and_one_that_became_the_slowest_gets_nothing() -> None:
    kw = dict(margin=0.02, floor_w=200, ceiling_w=700, probe_w=25)
    held = recommend("g", POINTS, 1600 * MHZ, 0.985, 1.0, limit_w=480, **kw)
    assert held is not None and (held.basis, held.limit_w) == ("hold", 480)
    assert recommend("g", POINTS, 1600 * MHZ, 1.0, 1.0, limit_w=480, **kw) is None  # it is the slowest now
    assert recommend("g", POINTS, 1980 * MHZ, 0.985, 1.0, limit_w=700, **kw) is None  # nothing leased: nothing


def test_a_probe_never_cuts_more_than_the_clock_in_proportion() -> None:
    low = [OperatingPoint(1800 * MHZ, 600.0)]
    rec = recommend("g", low, 1800 * MHZ, 0.97, 1.0, margin=0.02, floor_w=200, ceiling_w=700, probe_w=100)
    assert rec is not None and rec.basis == "probe"
    assert rec.limit_w == pytest.approx(600 * rec.clock_hz / (1800 * MHZ), abs=0.1)
