"""Power-slack leases through the policy engine, the real pynvml over the simulated NVML: dry run sets nothing,
ever; enforce lowers only what the policy would otherwise want, never below the floor; every limit returns when
its lease runs out or is withdrawn; thermal capping and the operator's persistent limit win; every step audited."""

from __future__ import annotations

from gpumond.agent.policy.lease import Guard, Leases, Offer, renew
from gpumond.nvml.sim import ManualClock
from tests.contract.policy_rig import HOT, make

ENFORCE_SLACK = {"power_slack": {"mode": "enforce"}, "thermal": {"enabled": False}}


class Book:
    """The leases the engine reads, as the puller would hold them (offered through the pure renew())."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.leases = Leases()

    def offer(self, offers: dict[str, float], lease_s: float = 60, applied: float = 700) -> None:
        self.leases = renew(self.leases, [Offer(u, w, "llama") for u, w in offers.items()],
                            dict.fromkeys(offers, applied), self.clock.now(), lease_s, Guard(8, 1000, 0))

    def __call__(self) -> Leases:
        return self.leases


def rig(rigs, tmp_path, policy):
    clock = ManualClock()
    book = Book(clock)
    r = make(rigs, tmp_path, policy=policy, clock=clock, leases=book)
    return r, book


def test_dry_run_computes_logs_and_exports_but_never_changes_a_limit(tmp_path, rigs) -> None:
    for i, policy in enumerate(({"thermal": {"enabled": False}},  # power_slack.mode defaults to dry_run
                                {"mode": "dry_run", **ENFORCE_SLACK})):  # the policy's dry run covers leases too
        (tmp_path / str(i)).mkdir()
        r, book = rig(rigs, tmp_path / str(i), policy)
        r.run(2)
        book.offer({r.sim.gpus[0].uuid: 450.0})
        limits = []
        for _ in range(120):
            r.run(1)
            limits.append(tuple(g.power_limit_w for g in r.sim.gpus))
        assert set(limits) == {(700.0, 700.0)}
        assert not [e for e in r.audit() if e["action"] in ("set_limit", "reapply", "restore")]
    first = [e for e in rigs[0].audit() if e["action"] == "lease_dry_run"]
    assert first and first[0]["would_set_w"] == 450.0 and first[0]["job"] == "llama"
    assert [e["action"] for e in rigs[0].audit()] == ["lease_dry_run", "lease_end"]  # it ran out after 60 s


def test_a_lease_lowers_the_limit_and_it_returns_when_the_lease_runs_out(tmp_path, rigs) -> None:
    r, book = rig(rigs, tmp_path, ENFORCE_SLACK)
    r.run(2)
    book.offer({r.sim.gpus[0].uuid: 450.0}, lease_s=30)
    r.run(1)
    assert [g.power_limit_w for g in r.sim.gpus] == [450.0, 700.0]
    assert r.value("gpumond_policy_power_slack_lease_watts", gpu="0", dry_run="false") == 450.0
    r.run(30)  # not renewed: back to the limit it would otherwise have, within one lease
    assert [g.power_limit_w for g in r.sim.gpus] == [700.0, 700.0]
    actions = [e["action"] for e in r.audit()]
    assert actions == ["set_limit", "lease_end", "restore"] or actions == ["set_limit", "lease_end", "set_limit"]


def test_a_withdrawn_offer_ends_the_lease_at_the_next_cycle(tmp_path, rigs) -> None:
    r, book = rig(rigs, tmp_path, ENFORCE_SLACK)
    r.run(2)
    book.offer({r.sim.gpus[0].uuid: 500.0})
    r.run(5)
    assert r.sim.gpus[0].power_limit_w == 500.0
    book.offer({})  # the job ended, or its step time rose: the service offers nothing for it
    r.run(1)
    assert r.sim.gpus[0].power_limit_w == 700.0


def test_the_floor_and_the_persistent_limit_win(tmp_path, rigs) -> None:
    r, book = rig(rigs, tmp_path, {**ENFORCE_SLACK, "power_slack": {"mode": "enforce", "floor_w": 400},
                                   "power_limit": {"per_gpu": {"1": 450}}})
    r.run(2)
    book.offer({r.sim.gpus[0].uuid: 250.0, r.sim.gpus[1].uuid: 600.0})
    r.run(1)
    assert [g.power_limit_w for g in r.sim.gpus] == [400.0, 450.0]  # floor; a lease never raises a limit


def test_thermal_capping_wins_over_a_lease(tmp_path, rigs) -> None:
    clock = ManualClock()
    book = Book(clock)
    r = make(rigs, tmp_path, policy={"power_slack": {"mode": "enforce"}}, scenario=HOT, clock=clock,
             leases=book)
    r.run(600)  # the hot GPU is capped by the thermal controller
    capped = r.sim.gpus[0].power_limit_w
    assert capped < 650
    book.offer({r.sim.gpus[0].uuid: 650.0, r.sim.gpus[1].uuid: 650.0}, lease_s=10_000)
    r.run(30)
    assert r.sim.gpus[0].power_limit_w <= capped + 10  # the lower of the two: thermal's
    assert r.sim.gpus[1].power_limit_w == 650.0


def test_an_agent_restarted_holds_no_lease_and_puts_the_limit_back(tmp_path, rigs) -> None:
    r, book = rig(rigs, tmp_path, ENFORCE_SLACK)
    r.run(2)
    book.offer({r.sim.gpus[0].uuid: 450.0}, lease_s=10_000)
    r.run(1)
    assert r.sim.gpus[0].power_limit_w == 450.0
    r.session.close()  # the process dies (no SIGTERM restore); the GPU keeps the leased limit
    again = make([], tmp_path, policy=ENFORCE_SLACK, sim=r.sim, clock=r.clock, leases=Book(r.clock))
    again.run(1)
    assert r.sim.gpus[0].power_limit_w == 700.0
    assert "restoring the original limit" in again.audit()[-1]["reason"]
    again.session.close()


def test_a_lease_steps_from_what_is_set_or_in_dry_run_from_what_would_be(tmp_path, rigs) -> None:
    r, book = rig(rigs, tmp_path, ENFORCE_SLACK)
    uuid = r.sim.gpus[0].uuid
    r.run(2)
    assert r.engine.lease_bases() == {g.uuid: 700.0 for g in r.sim.gpus}
    book.offer({uuid: 450.0})
    assert r.engine.lease_bases()[uuid] == 700.0  # held, not yet taken up: the GPU is still at 700 W
    r.run(1)
    assert r.engine.lease_bases()[uuid] == 450.0 == r.sim.gpus[0].power_limit_w


def test_in_dry_run_a_lease_steps_from_the_lease_that_would_be(tmp_path, rigs) -> None:
    r, book = rig(rigs, tmp_path, {"thermal": {"enabled": False}})  # power_slack.mode defaults to dry_run
    r.run(2)
    book.offer({r.sim.gpus[0].uuid: 450.0})
    r.run(1)
    assert r.engine.lease_bases()[r.sim.gpus[0].uuid] == 450.0  # nothing set: the lease that would be
    assert r.sim.gpus[0].power_limit_w == 700.0
