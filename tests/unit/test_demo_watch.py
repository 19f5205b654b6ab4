"""The demo watcher's pure diffs: agents' alerts and power caps, and findings, become story events on the right
node, GPU index and rank (UUID → node/GPU from gpumond_gpu_info, GPU → rank from the job's roster)."""

from collections import namedtuple

from gpumond.demo.story import Place
from gpumond.demo.watch import Roster, alert_changes, cap_changes, finding_changes
from gpumond.rules.types import Finding

S = namedtuple("S", "name labels value")


def info(node, n):
    return {"gpumond_gpu_info": [S("gpumond_gpu_info", {"gpu": str(i), "uuid": f"GPU-{node}-{i}"}, 1.0)
                                 for i in reversed(range(n))]}


ROSTER = Roster.from_gpu_info([("n0", info("n0", 4)), ("n1", info("n1", 4))])


def test_roster_fills_nodes_in_order_and_maps_uuid_gpu_and_rank_to_one_place():
    assert ROSTER.ranks[5] == ("n1", 1, "GPU-n1-1")
    want = Place("n1", 1, 5)
    assert ROSTER.place(uuid="GPU-n1-1") == want
    assert ROSTER.place(node="n1", gpu=1) == want
    assert ROSTER.place(rank=5) == want
    assert ROSTER.place(node="n9", gpu=2) == Place("n9", 2)  # unknown: keeps what it was told
    assert ROSTER.place() == Place()


def alerts(*active):
    return {"gpumond_alert_active": [S("gpumond_alert_active", {"alertname": a, "gpu": g, "xid": x, "node": "n1"}, 1.0)
                                     for a, g, x in active]}


def test_alerts_fire_when_they_appear_and_resolve_when_they_go_with_rank_and_xid_meaning():
    seen, events = alert_changes("n1", frozenset(), alerts(("GpuXidCritical", "2", "48")), ROSTER, 41.0)
    (e,) = events
    assert (e.kind, e.name, e.state, e.place, e.t_s) == ("alert", "GpuXidCritical", "firing", Place("n1", 2, 6), 41.0)
    assert e.detail[0] == "XID 48: Double-bit (uncorrectable) ECC error"
    seen, events = alert_changes("n1", seen, alerts(("GpuXidCritical", "2", "48")), ROSTER, 42.0)
    assert events == []
    seen_other, _ = alert_changes("n0", seen, alerts(), ROSTER, 43.0)  # another node's scrape keeps n1's alerts
    assert seen_other == seen
    seen, events = alert_changes("n1", seen, alerts(), ROSTER, 71.0)
    assert [(e.name, e.state, e.place) for e in events] == [("GpuXidCritical", "resolved", Place("n1", 2, 6))]
    assert seen == frozenset()


def limits(w, temp=86.0):
    return {"gpumond_gpu_power_limit_watts": [S("x", {"gpu": "3"}, w)],
            "gpumond_gpu_temperature_celsius": [S("x", {"gpu": "3"}, temp)]}


def test_the_thermal_cap_fires_on_a_cut_moves_in_big_steps_and_resolves_back_at_the_normal_limit():
    state, events = cap_changes("n0", {}, limits(700), ROSTER, 1.0)
    assert events == []  # the first reading is the normal limit
    out = []
    for t, w in ((10, 690), (11, 588), (12, 580), (13, 520), (60, 620), (62, 700), (63, 700)):
        state, events = cap_changes("n0", state, limits(w), ROSTER, t)
        out += [(e.t_s, e.state, e.detail[0]) for e in events]
    assert out == [
        (11, "firing", "power limit 700 W → 588 W, cut (temperature 86 °C)"),  # a 10 W wobble is not a cap
        (13, "firing", "power limit 588 W → 520 W, cut (temperature 86 °C)"),
        (60, "firing", "power limit 520 W → 620 W, given back (temperature 86 °C)"),
        (62, "resolved", "power limit 620 W → 700 W, given back (temperature 86 °C)"),
    ]


def test_a_cut_made_before_the_first_look_is_still_told_against_the_boards_default_limit():
    # Seen on a loaded machine: the agent capped the hot GPU before the demo's watcher first read it.
    first = {**limits(588), "gpumond_gpu_power_limit_default_watts": [S("x", {"gpu": "3"}, 700.0)]}
    state, events = cap_changes("n0", {}, first, ROSTER, 1.0)
    assert [(e.state, e.detail[0]) for e in events] == [("firing", "power limit 700 W → 588 W, cut (temperature 86 °C)")]
    _, events = cap_changes("n0", state, {**first, **limits(700)}, ROSTER, 2.0)
    assert [e.state for e in events] == ["resolved"]


def finding(kind, state, *, node=None, rank=None, uuid=None, **ev):
    return Finding(kind=kind, job="j", node=node, rank=rank, gpu_uuid=uuid, score=5.0, since=0.0, state=state,
                   evidence=ev)


def test_findings_change_state_and_resolve_or_drop_when_they_go():
    straggler = dict(node="n1", rank=5, uuid="GPU-n1-1")
    seen, events = finding_changes({}, [finding("straggler", "pending", **straggler),
                                        finding("job_slowdown", "pending")], ROSTER, 20.0)
    assert [(e.name, e.state, e.place, e.detail) for e in events] == [
        ("straggler", "pending", Place("n1", 1, 5), ()), ("job_slowdown", "pending", Place(), ())]
    seen, events = finding_changes(seen, [finding("straggler", "firing", **straggler,
                                                  step_time_s=0.3, baseline_step_time_s=0.25, slowdown=1.2)],
                                   ROSTER, 22.0)
    assert [(e.name, e.state) for e in events] == [("straggler", "firing"), ("job_slowdown", "dropped")]
    seen, events = finding_changes(seen, [], ROSTER, 90.0)
    assert [(e.name, e.state, e.place) for e in events] == [("straggler", "resolved", Place("n1", 1, 5))]


def test_a_firing_finding_carries_its_evidence_in_words():
    _, (e,) = finding_changes({}, [finding("job_slowdown", "firing", step_time_s=0.3858, baseline_step_time_s=0.2528,
                                           slowdown=1.526)], ROSTER, 30.0)
    assert e.detail == ("step time 0.386 s vs its own baseline 0.253 s (1.53×)",)
