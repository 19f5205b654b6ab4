"""The demo's story: matching observed events to planted faults, completion, and the closing summary."""

import threading

import pytest

from gpumond.demo.plan import DemoPlan
from gpumond.demo.story import (
    Event,
    Place,
    Planted,
    Timeline,
    complete,
    episodes,
    false_alarms,
    match,
    outcomes,
    render_event,
    render_summary,
    waiting_for,
)

HOT = Place("n1", 3, 11)
STARVED = Place("n2", 5, 21)
XID = Place("n0", 6, 6)
JOB = Place()

FAULTS = (
    Planted("cooling", "loses cooling 4–24 s", HOT, 4.0, 24.0, expect=("action:thermal_cap", "finding:straggler"),
            related=("finding:job_slowdown",)),
    Planted("loader", "loader stalls 10–38 s", STARVED, 10.0, 38.0, expect=("finding:io_starved_rank",),
            related=("finding:job_slowdown",)),
    Planted("xid", "XID 48 at 40 s", XID, 40.0, 40.0, expect=("alert:GpuXidCritical",),
            lasting={"alert:GpuRowRemapPending": "until an operator resets the GPU"}),
)


def ev(t, kind, name, state, place, **kw):
    return Event(t, kind, name, state, place, **kw)


def timeline(*events):
    tl = Timeline(FAULTS)
    return tl, [tl.record(e) for e in events]


# ----- places ---------------------------------------------------------------------------------------

def test_place_reads_as_node_gpu_rank_and_job():
    assert str(HOT) == "n1 · GPU 3 · rank 11"
    assert str(Place("n1")) == "n1"
    assert str(JOB) == "whole job"


@pytest.mark.parametrize(("other", "covered"), [
    (Place("n1", 3, 11), True),
    (Place(None, None, 11), True),  # a finding names the rank
    (Place("n1", 3), True),  # an alert names node and GPU
    (Place("n1"), True),  # a node-level finding
    (Place("n1", 4, 12), False),
    (Place("n2", 3, 19), False),
    (Place(None, None, 12), False),
    (JOB, False),  # decided by the signal, not the place
])
def test_fault_place_covers_the_same_gpu_rank_or_node(other, covered):
    assert HOT.covers(other) is covered


# ----- matching -------------------------------------------------------------------------------------

def test_each_signal_matches_its_fault_on_its_place():
    assert match(ev(20, "finding", "straggler", "firing", HOT), FAULTS).key == "cooling"
    assert match(ev(30, "finding", "io_starved_rank", "firing", STARVED), FAULTS).key == "loader"
    assert match(ev(41, "alert", "GpuXidCritical", "firing", XID), FAULTS).key == "xid"
    assert match(ev(41, "alert", "GpuRowRemapPending", "firing", XID), FAULTS).key == "xid"


def test_right_signal_on_the_wrong_place_or_before_the_fault_is_not_a_match():
    assert match(ev(20, "finding", "straggler", "firing", STARVED), FAULTS) is None  # innocent rank blamed
    assert match(ev(20, "finding", "straggler", "firing", Place("n1", 4, 12)), FAULTS) is None
    assert match(ev(2, "finding", "straggler", "firing", HOT), FAULTS) is None  # before the cooling failed
    assert match(ev(20, "finding", "io_starved_rank", "firing", HOT), FAULTS) is None  # wrong kind there


def test_a_job_wide_finding_goes_to_the_earliest_active_fault_else_the_latest_begun():
    assert match(ev(15, "finding", "job_slowdown", "firing", JOB), FAULTS).key == "cooling"
    assert match(ev(30, "finding", "job_slowdown", "firing", JOB), FAULTS).key == "loader"
    assert match(ev(60, "finding", "job_slowdown", "firing", JOB), FAULTS).key == "loader"
    assert match(ev(3, "finding", "job_slowdown", "firing", JOB), FAULTS) is None


def test_a_page_matches_through_the_alert_or_finding_it_notifies_about():
    # TrainingStraggler is the rules service's alert for finding kind `straggler` (gpumond.alerts.catalogue)
    assert ev(21, "page", "TrainingStraggler", "firing", HOT).signal == "finding:straggler"
    assert ev(41, "page", "GpuXidCritical", "firing", XID).signal == "alert:GpuXidCritical"
    assert match(ev(21, "page", "TrainingStraggler", "firing", HOT, via="slack"), FAULTS).key == "cooling"
    assert match(ev(41, "page", "GpuXidCritical", "firing", XID, via="pagerduty"), FAULTS).key == "xid"


def test_timeline_keeps_an_episodes_fault_until_it_resolves():
    # job_slowdown fires while only the cooling is active; it must not hop to the loader fault later
    _, out = timeline(ev(9, "finding", "job_slowdown", "firing", JOB),
                      ev(45, "finding", "job_slowdown", "resolved", JOB),
                      ev(50, "finding", "job_slowdown", "firing", JOB))
    assert [e.fault for e in out] == ["cooling", "cooling", "loader"]


def test_timeline_is_safe_to_record_from_several_threads():
    seen = []
    tl = Timeline(FAULTS, on_event=seen.append)
    def burst(i):
        for _ in range(50):
            tl.record(ev(20 + i, "alert", "Other", "firing", Place("n3", i)))

    threads = [threading.Thread(target=burst, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert len(tl.events) == len(seen) == 200


# ----- episodes, completion, false alarms --------------------------------------------------------------

STORY = (
    ev(17, "action", "thermal_cap", "firing", HOT),
    ev(19, "finding", "straggler", "pending", HOT),
    ev(21, "finding", "straggler", "firing", HOT),
    ev(22, "action", "thermal_cap", "firing", HOT),  # a further cut: same episode
    ev(30, "finding", "io_starved_rank", "firing", STARVED),
    ev(41, "alert", "GpuXidCritical", "firing", XID),
    ev(42, "alert", "GpuRowRemapPending", "firing", XID),
    ev(60, "finding", "io_starved_rank", "resolved", STARVED),
    ev(71, "alert", "GpuXidCritical", "resolved", XID),
    ev(90, "action", "thermal_cap", "resolved", HOT),
)


def test_episodes_run_from_first_firing_to_resolved_and_pending_does_not_count():
    _, out = timeline(*STORY)
    eps = {(e.signal, e.place): e for e in episodes(out)}
    assert eps[("finding:straggler", HOT)].fired_s == 21
    assert eps[("finding:straggler", HOT)].resolved_s is None
    assert eps[("action:thermal_cap", HOT)].fired_s == 17
    assert eps[("action:thermal_cap", HOT)].resolved_s == 90
    assert eps[("finding:io_starved_rank", STARVED)].resolved_s == 60
    _, dropped = timeline(ev(19, "finding", "straggler", "pending", HOT),
                          ev(25, "finding", "straggler", "dropped", HOT))
    assert episodes(dropped) == []


def test_refiring_after_resolving_is_one_episode_counted_twice():
    _, out = timeline(ev(30, "finding", "io_starved_rank", "firing", STARVED),
                      ev(33, "finding", "io_starved_rank", "resolved", STARVED),
                      ev(35, "finding", "io_starved_rank", "firing", STARVED),
                      ev(60, "finding", "io_starved_rank", "resolved", STARVED))
    (ep,) = episodes(out)
    assert (ep.fired_s, ep.resolved_s, ep.fired) == (30, 60, 2)


def test_complete_needs_every_fault_found_ended_and_its_signals_resolved_except_lasting_ones():
    _, out = timeline(*STORY)
    assert not complete(FAULTS, out, 95)  # the straggler still fires
    assert waiting_for(FAULTS, out, 95) == ["cooling on n1 · GPU 3 · rank 11: straggler to resolve"]
    _, out = timeline(*STORY, ev(100, "finding", "straggler", "resolved", HOT))
    assert complete(FAULTS, out, 100)  # GpuRowRemapPending still fires: only an operator clears it
    assert waiting_for(FAULTS, out, 100) == []


def test_not_complete_while_a_fault_is_unfound_or_not_over():
    _, out = timeline(*STORY[:5])
    assert not complete(FAULTS, out, 35)
    left = waiting_for(FAULTS, out, 35)
    assert "loader on n2 · GPU 5 · rank 21: to end at 38 s; io_starved_rank to resolve" in left
    assert "xid to start at 40 s" in left
    found = {o.fault.key: o.found for o in outcomes(FAULTS, out)}
    assert found == {"cooling": True, "loader": True, "xid": False}


def test_an_innocent_place_firing_is_a_false_alarm_and_does_not_block_completion():
    innocent = ev(25, "finding", "straggler", "firing", Place("n3", 0, 24))
    _, out = timeline(*STORY, innocent, ev(100, "finding", "straggler", "resolved", HOT))
    (fa,) = false_alarms(out)
    assert (fa.signal, fa.place, fa.fault) == ("finding:straggler", Place("n3", 0, 24), None)
    assert complete(FAULTS, out, 100)


# ----- rendering -------------------------------------------------------------------------------------

def test_event_lines_name_node_gpu_rank_and_the_fault_with_its_delay():
    _, out = timeline(ev(21, "finding", "straggler", "firing", HOT, detail=("computes 77 % of each step",)),
                      ev(60, "finding", "io_starved_rank", "resolved", STARVED),
                      ev(25, "finding", "straggler", "firing", Place("n3", 0, 24)),
                      ev(17, "action", "thermal_cap", "firing", HOT, detail=("power limit 700 W → 520 W",)))
    lines = [render_event(e, FAULTS) for e in out]
    assert lines[0][0].startswith("FINDING FIRING   straggler on n1 · GPU 3 · rank 11  ← planted: cooling (+17 s)")
    assert lines[0][1].strip() == "computes 77 % of each step"
    assert lines[1] == ["FINDING resolved io_starved_rank on n2 · GPU 5 · rank 21  "
                        "← planted: loader (+22 s after it ended)"]
    assert lines[2][0].endswith("← not planted")
    assert lines[3] == ["POLICY  acts     thermal power cap on n1 · GPU 3 · rank 11: power limit 700 W → 520 W  "
                        "← planted: cooling (+13 s)"]


def test_summary_maps_each_fault_to_what_fired_when_and_when_it_resolved():
    _, out = timeline(*STORY, ev(100, "finding", "straggler", "resolved", HOT))
    text = render_summary(FAULTS, out, 100)
    lines = text.splitlines()
    assert text.startswith("3 faults planted: 3 found, 3 found and resolved; 0 false alarms.")
    cooling = lines.index("cooling on n1 · GPU 3 · rank 11: loses cooling 4–24 s")
    assert lines[cooling + 1].startswith("  thermal power cap ")
    line = next(x for x in text.splitlines() if "finding straggler" in x)
    assert "+17 s" in line and "+76 s" in line  # fired 21 − 4, resolved 100 − 24
    xid = next(x for x in text.splitlines() if "GpuRowRemapPending" in x)
    assert "(stays until an operator resets" in xid and xid.rstrip().endswith("still firing")
    assert lines[lines.index(xid) + 1].strip() == "the GPU)"  # the note wraps within its column
    assert "false alarms): none." in text
    assert "pages" not in text.splitlines()[3]  # no page column until pages exist


def test_summary_says_what_was_missed_and_lists_false_alarms():
    _, out = timeline(ev(17, "action", "thermal_cap", "firing", HOT),
                      ev(25, "finding", "straggler", "firing", Place("n3", 0, 24)))
    text = render_summary(FAULTS, out, 50)
    assert "finding straggler: NOT FOUND" in text
    assert "NOTHING (missed)" in text  # the loader and the XID: nothing fired at all
    assert "0 found" in text and "1 false alarm;" not in text and "1 false alarm." in text
    assert "  finding straggler on n3 · GPU 0 · rank 24 at 25 s, still firing" in text


def test_a_short_demo_does_not_call_faults_it_never_reached_or_had_no_time_to_find_missed():
    _, out = timeline(ev(17, "action", "thermal_cap", "firing", HOT))
    text = render_summary(FAULTS, out, 20)  # --duration 20: the loader began 10 s before the end, the XID after it
    assert "NOTHING (missed)" not in text
    assert "nothing yet (it began 10 s before the end)" in text
    assert "not reached (planted at 40 s, the demo ended at 20 s)" in text


def test_pages_are_counted_per_fault_once_they_exist():
    _, out = timeline(*STORY,
                      ev(21.5, "page", "TrainingStraggler", "firing", HOT, via="slack"),
                      ev(41.5, "page", "GpuXidCritical", "firing", XID, via="pagerduty"),
                      ev(41.6, "page", "GpuXidCritical", "firing", XID, via="slack"),
                      ev(71.5, "page", "GpuXidCritical", "resolved", XID, via="pagerduty"))
    pages = {o.fault.key: o.pages for o in outcomes(FAULTS, out)}
    assert pages == {"cooling": 1, "loader": 0, "xid": 2}
    header = render_summary(FAULTS, out, 100).splitlines()[3]
    assert header.split()[-1] == "pages"
    line = next(x for x in render_summary(FAULTS, out, 100).splitlines() if "alert GpuXidCritical" in x)
    assert line.split()[-1] == "2"
    assert render_event(out[-3], FAULTS)[0].startswith("PAGE    FIRING   GpuXidCritical via pagerduty on n0 · GPU 6")


# ----- the demo's own plan --------------------------------------------------------------------------

def test_the_demo_plan_places_each_fault_on_its_node_gpu_and_rank_and_ends_it():
    plan = DemoPlan()
    faults = {f.key: f for f in plan.faults()}
    assert faults["cooling"].place == Place("demo-node-01", 3, 11)
    assert faults["loader"].place == Place("demo-node-02", 5, 21)
    assert faults["xid"].place == Place("demo-node-00", 6, 6)
    assert all(f.start_s <= f.end_s for f in faults.values())
    hot = plan.scenario(1, speed=4)["faults"]
    assert hot == [{"gpu": 3, "kind": "cooling", "factor": plan.hot_factor, "at_s": plan.hot_at_s * 4,
                    "duration_s": (plan.hot_end_s - plan.hot_at_s) * 4}]
    assert plan.agent_config(__import__("pathlib").Path("/x"))["policy"]["alerts"]["event_hold_s"] < 900


def test_the_demo_agents_enforce_explicitly_where_an_installed_agent_would_only_dry_run():
    from pathlib import Path

    from gpumond.config import AgentConfig

    demo = AgentConfig.model_validate(DemoPlan().agent_config(Path("/x")))
    assert demo.policy.mode == "enforce"  # the story is the cap acting on the hot (simulated) GPU
    assert AgentConfig.model_validate({"state_dir": "/x"}).policy.mode == "dry_run"


def test_a_fault_whose_signals_cleared_early_is_not_done_before_it_ends():
    only_loader = FAULTS[1:2]
    tl = Timeline(only_loader)
    out = [tl.record(e) for e in (ev(20, "finding", "io_starved_rank", "firing", STARVED),
                                  ev(30, "finding", "io_starved_rank", "resolved", STARVED))]
    assert not complete(only_loader, out, 35)
    assert waiting_for(only_loader, out, 35) == ["loader on n2 · GPU 5 · rank 21: to end at 38 s"]
    assert complete(only_loader, out, 38)


def test_a_signal_that_cleared_before_its_fault_ended_shows_a_negative_resolve_time():
    _, out = timeline(ev(30, "finding", "io_starved_rank", "firing", STARVED),
                      ev(33, "finding", "io_starved_rank", "resolved", STARVED))
    line = next(x for x in render_summary(FAULTS, out, 50).splitlines() if "io_starved_rank" in x)
    assert line.split()[-4:] == ["+20", "s", "-5", "s"]


def test_a_false_alarm_lists_its_pages_once_pages_exist():
    innocent = Place("n3", 0, 24)
    _, out = timeline(ev(25, "finding", "straggler", "firing", innocent),
                      ev(26, "page", "TrainingStraggler", "firing", innocent, via="slack"))
    assert "  finding straggler on n3 · GPU 0 · rank 24 at 25 s, still firing, 1 page" in render_summary(FAULTS, out, 50)


def test_a_page_that_arrives_before_its_finding_is_shown_after_it():
    # the sink can deliver before the watcher's next poll of the rules service: the operator reads FINDING, then PAGE
    seen = []
    tl = Timeline(FAULTS, on_event=seen.append)
    tl.record(ev(20.5, "page", "TrainingStraggler", "firing", HOT, via="pagerduty"))
    assert seen == []
    tl.record(ev(21, "finding", "straggler", "firing", HOT))
    tl.record(ev(22, "page", "TrainingStraggler", "firing", HOT, via="slack"))  # its signal fires: shown at once
    assert [(e.kind, e.via) for e in seen] == [("finding", None), ("page", "pagerduty"), ("page", "slack")]
    assert [e.kind for e in tl.events] == ["page", "finding", "page"]  # kept in arrival order for the summary


def test_a_page_whose_signal_never_shows_firing_is_shown_at_flush():
    seen = []
    tl = Timeline(FAULTS, on_event=seen.append)
    tl.record(ev(30, "page", "GpuXidCritical", "firing", XID, via="pagerduty"))
    tl.record(ev(31, "page", "TrainingStraggler", "firing", HOT, via="slack"))
    tl.record(ev(32, "alert", "Other", "firing", Place("n3", 1)))
    assert [e.kind for e in seen] == ["alert"]
    tl.flush()
    assert [(e.kind, e.t_s) for e in seen] == [("alert", 32), ("page", 30), ("page", 31)]
    tl.flush()
    assert len(seen) == 3  # shown once


def test_a_page_that_arrives_before_the_watcher_sees_its_signal_still_counts():
    # The sink delivers within the evaluation; the demo's watcher polls once a second and may see it later.
    _, out = timeline(ev(20.5, "page", "TrainingStraggler", "firing", HOT, via="pagerduty"),
                      ev(21, "finding", "straggler", "firing", HOT))
    assert {o.fault.key: o.pages for o in outcomes(FAULTS, out)}["cooling"] == 1


def test_the_drain_alerts_pages_count_on_the_node_drain_row():
    # GpumondNodeDrained announces the remediation action; no watcher event carries it, so its pages must
    # land on the drain's episode, not vanish (the summary used to say 0 pages for a drain that paged twice).
    faults = (Planted("xid", "XID 48 at 40 s", XID, 40.0, 40.0, expect=("alert:GpuXidCritical", "action:drain")),)
    tl = Timeline(faults)
    node = Place("n0")
    out = [tl.record(e) for e in (ev(41, "alert", "GpuXidCritical", "firing", XID),
                                  ev(42, "action", "drain", "firing", node),
                                  ev(42.1, "page", "GpumondNodeDrained", "firing", node, via="slack"),
                                  ev(42.2, "page", "GpumondNodeDrained", "firing", node, via="pagerduty"))]
    assert [(e.signal, e.pages) for e in episodes(out)] == [("alert:GpuXidCritical", 0), ("action:drain", 2)]
    assert false_alarms(out) == []
    line = next(x for x in render_summary(faults, out, 50).splitlines() if "node drain" in x)
    assert line.split()[-1] == "2"


def test_the_summary_fits_an_80_column_terminal_with_the_demos_own_faults_and_long_signals():
    faults = DemoPlan().faults()
    hot, starved, xid = (f.place for f in faults)
    events: list[Event] = []
    tl = Timeline(faults)
    for e in (ev(17, "action", "thermal_cap", "firing", hot), ev(21, "finding", "straggler", "firing", hot),
              ev(22, "finding", "io_starved_rank", "firing", starved),
              ev(41, "alert", "GpuEccUncorrectedIncreasing", "firing", Place(xid.node, 2, 2)),
              ev(41, "alert", "GpuRowRemapPending", "firing", xid),
              ev(41.5, "page", "GpuXidCritical", "firing", xid, via="pagerduty"),
              ev(60, "finding", "straggler", "firing", Place("demo-node-03", 7, 31))):
        events.append(tl.record(e))
    text = render_summary(faults, events, 90)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "alert GpuRowRemapPending (stays until" in text
    assert render_summary(faults, events, 90, width=60).count("\n") > text.count("\n")  # narrower: more lines


def test_the_demo_clock_never_goes_backwards_and_a_late_event_says_its_own_time():
    import time

    from gpumond.demo.run import _Teller

    said: list[str] = []
    tell = _Teller(said.append, t0=time.monotonic())
    tell.event(["FINDING  FIRING   straggler on n1"], 14.4)
    tell.event(["PAGE     FIRING   TrainingStraggler via slack on n1"], 14.0)  # held until its finding was seen
    tell.event(["ALERT    FIRING   GpuXidCritical on n0"], 20.0)
    tell.line("still waiting")  # the wall clock here reads ~0 s
    assert said == ["[  14.4s] FINDING  FIRING   straggler on n1",
                    "[  14.4s] PAGE     FIRING   TrainingStraggler via slack on n1  (at 14.0s)",
                    "[  20.0s] ALERT    FIRING   GpuXidCritical on n0",
                    "[  20.0s] still waiting"]
