"""Power-slack leases held by the agent (gpumond/agent/policy/lease.py): renewed by each answer, withdrawn
when not offered, run out without answers, stepped down under a guard, never raising a limit."""

from __future__ import annotations

import pytest

from gpumond.agent.policy.lease import (Guard, Leases, Offer, OfferError, expire, leased_limit, parse_offers,
                                        renew)

A, B, C = "GPU-a", "GPU-b", "GPU-c"
APPLIED = {A: 700.0, B: 700.0, C: 700.0}


def test_a_lowering_steps_down_under_the_guard_and_raising_is_at_once() -> None:
    guard = Guard(max_gpus=2, max_step_w=50)
    leases = renew(Leases(), [Offer(A, 500, "j"), Offer(B, 680, "j"), Offer(C, 450, "j")], APPLIED, 0, 60, guard)
    # the two largest cuts first, 50 W at most each; B waits for a later answer
    assert {u: l.limit_w for u, l in leases.held.items()} == {A: 650, C: 650}
    leases = renew(leases, [Offer(A, 500, "j"), Offer(B, 680, "j"), Offer(C, 450, "j")],
                   {A: 650, B: 700, C: 650}, 15, 60, guard)
    assert {u: l.limit_w for u, l in leases.held.items()} == {A: 600, C: 600}  # B still waits its turn
    leases = renew(leases, [Offer(A, 690, "j"), Offer(C, 450, "j")], {A: 600, B: 680, C: 600}, 30, 60, guard)
    assert {u: l.limit_w for u, l in leases.held.items()} == {A: 690, C: 550}  # B withdrawn, A given back


def test_answers_faster_than_policy_cycles_still_lower_one_step_at_a_time() -> None:
    guard = Guard(max_gpus=2, max_step_w=100)
    leases = renew(Leases(), [Offer(A, 450, "j")], APPLIED, 0, 60, guard)
    assert leases.held[A].limit_w == 600
    for t in (1, 2, 3):  # the policy has not taken the lease up yet: the GPU is still at 700 W
        leases = renew(leases, [Offer(A, 450, "j")], APPLIED, t, 60, guard)
        assert leases.held[A].limit_w == 600
    leases = renew(leases, [Offer(A, 450, "j")], {A: 600.0}, 4, 60, guard)  # taken up: the next step
    assert leases.held[A].limit_w == 500
    leases = renew(leases, [Offer(A, 550, "j")], APPLIED, 5, 60, guard)  # a smaller cut is taken, not stepped
    assert leases.held[A].limit_w == 550


def test_leases_run_out_without_an_answer_and_an_empty_answer_withdraws_them() -> None:
    leases = renew(Leases(), [Offer(A, 650, "j")], APPLIED, 0, 60, Guard())
    assert leases.limit(A, 59.9) is not None and leases.limit(A, 60) is None
    assert expire(leases, 60).held == {}
    assert renew(leases, [], APPLIED, 10, 60, Guard()).held == {}
    assert renew(Leases(), [Offer("GPU-elsewhere", 100, "j")], APPLIED, 0, 60, Guard()).held == {}


def test_a_lease_only_lowers_and_never_below_the_floor() -> None:
    leases = renew(Leases(), [Offer(A, 650, "j")], APPLIED, 0, 60, Guard())
    lease = leases.limit(A, 1)
    assert leased_limit(700, lease, 200) == 650
    assert leased_limit(600, lease, 200) is None  # thermal (or a person's limit) already lower: it wins
    assert leased_limit(700, lease, 680) == 680
    assert leased_limit(700, None, 200) is None


@pytest.mark.parametrize("body, problem", [
    ([], "no 'offers' list"),
    ({"offers": [1]}, "offers[0]: not an object"),
    ({"offers": [{"gpu_uuid": "", "limit_w": 1}]}, "offers[0].gpu_uuid"),
    ({"offers": [{"gpu_uuid": A, "limit_w": float("nan")}]}, "offers[0].limit_w"),
    ({"offers": [{"gpu_uuid": A, "limit_w": True}]}, "offers[0].limit_w"),
])
def test_an_unreadable_answer_is_one_line_naming_the_field(body: object, problem: str) -> None:
    with pytest.raises(OfferError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        parse_offers(body)
    assert parse_offers({"offers": [{"gpu_uuid": A, "limit_w": 600, "job": "j"}]}) == [Offer(A, 600.0, "j")]


def test_a_small_raise_waits_in_the_deadband() -> None:
    guard = Guard(max_gpus=2, max_step_w=50, deadband_w=5)
    leases = renew(Leases(), [Offer(A, 650, "j")], APPLIED, 0, 60, guard)
    leases = renew(leases, [Offer(A, 653, "j")], {A: 650}, 15, 60, guard)
    assert leases.held[A].limit_w == 650 and leases.held[A].until == 75
    assert renew(leases, [Offer(A, 660, "j")], {A: 650}, 30, 60, guard).held[A].limit_w == 660


def test_a_hold_renews_the_lease_as_it_is_whatever_limit_the_service_last_saw() -> None:
    leases = renew(Leases(), [Offer(A, 600, "j")], APPLIED, 0, 60, Guard(2, 50))
    assert leases.held[A].limit_w == 650
    # The service saw 700 (its telemetry lags the agent's set): a hold must not raise the lease back.
    leases = renew(leases, [Offer(A, 700, "j", hold=True)], {A: 650}, 15, 60, Guard(2, 50))
    assert (leases.held[A].limit_w, leases.held[A].until) == (650, 75)
    assert renew(Leases(), [Offer(A, 600, "j", hold=True)], APPLIED, 0, 60, Guard()).held == {}
    assert parse_offers({"offers": [{"gpu_uuid": A, "limit_w": 600, "job": "j", "basis": "hold"}]})[0].hold
