"""Incremental evaluation (engine.evaluate): a job with nothing new since its last judgement keeps that
judgement's candidates instead of being judged again; anything new, or `rejudge_s` of wall time, judges it."""

from dataclasses import replace

from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.engine import DetectorState, FeatureFns, evaluate
from gpumond.rules.detectors.gpu_batch import gpu_features_many
from gpumond.rules.detectors.rank_batch import job_rank_features

from tests.unit.detector_inputs import NOW, build, job as share_job

CFG = DetectorConfig()


class Counting:
    """A feature function (the default rank features unless told), counting the calls (the jobs it measured)."""

    def __init__(self, fn=job_rank_features) -> None:
        self.fn = fn
        self.calls = 0

    def __call__(self, *a, **kw):
        self.calls += 1
        return self.fn(*a, **kw)


def starved():
    return build(wait={5: 0.5})


def test_a_job_with_nothing_new_keeps_its_candidates_without_being_judged_again():
    fns = FeatureFns(ranks=Counting())
    inputs = starved()
    state, first = evaluate(inputs, DetectorState(), CFG, fns)
    assert [(c.kind, c.rank) for c in first] == [("io_starved_rank", 5)]
    state, again = evaluate(replace(inputs, now=inputs.now + 5), state, CFG, fns)
    assert fns.ranks.calls == 1 and again == first
    assert state.rank_features["job-a"]  # what the service exports per rank stays
    # rejudge_s later it is judged again, new data or not (stall and liveness rules read the clock)
    evaluate(replace(inputs, now=inputs.now + CFG.rejudge_s), state, CFG, fns)
    assert fns.ranks.calls == 2


def test_a_new_push_a_new_step_or_new_telemetry_judges_the_job_again():
    inputs = starved()
    ranks = inputs.jobs["job-a"]
    w = ranks[3]
    changed = {
        "push": {**ranks, 3: replace(w, last_push=w.last_push + 1)},
        "heartbeat": {**ranks, 3: replace(w, last_beat=inputs.now + 1)},
        "step": {**ranks, 3: replace(w, steps=w.steps[1:] + (replace(w.steps[-1], end=w.steps[-1].end + 1),))},
    }
    for what, job in changed.items():
        fns = FeatureFns(ranks=Counting())
        state, _ = evaluate(inputs, DetectorState(), CFG, fns)
        evaluate(replace(inputs, now=inputs.now + 5, jobs={"job-a": job}), state, CFG, fns)
        assert fns.ranks.calls == 2, what
    fns = FeatureFns(ranks=Counting())
    state, _ = evaluate(inputs, DetectorState(), CFG, fns)
    uuid = w.info.gpu_uuid
    newer = inputs.gpu_windows[uuid][1:] + (replace(inputs.gpu_windows[uuid][-1], t=inputs.now + 1),)
    evaluate(replace(inputs, now=inputs.now + 5, gpu_windows={**inputs.gpu_windows, uuid: newer}), state, CFG, fns)
    assert fns.ranks.calls == 2
    fns = FeatureFns(ranks=Counting())
    state, _ = evaluate(inputs, DetectorState(), CFG, fns)
    evaluate(replace(inputs, now=inputs.now + 5, absent_nodes=frozenset({w.info.node})), state, CFG, fns)
    assert fns.ranks.calls == 2


def test_a_job_gone_from_the_store_is_forgotten():
    inputs = starved()
    state, _ = evaluate(inputs, DetectorState(), CFG)
    state, out = evaluate(replace(inputs, jobs={}), state, CFG)
    assert out == [] and state.judged == {}


def test_a_held_job_not_judged_now_keeps_its_state_and_candidates_while_another_is_judged():
    # A judgement on arrival passes only the jobs whose steps landed; the others are held, not gone.
    a, b = starved(), build()
    both = replace(a, jobs={"job-a": a.jobs["job-a"], "job-b": b.jobs["job-a"]},
                   gpu_windows={**a.gpu_windows, **b.gpu_windows})
    state, first = evaluate(both, DetectorState(), CFG)
    assert [(c.job, c.rank) for c in first] == [("job-a", 5)]
    only_b = replace(both, now=both.now + 1, jobs={"job-b": both.jobs["job-b"]})
    fns = FeatureFns(ranks=Counting())
    held, out = evaluate(only_b, state, CFG, fns, held={"job-a"})
    assert out == first and held.judged["job-a"] == state.judged["job-a"]
    assert held.rank_features["job-a"] == state.rank_features["job-a"] and fns.ranks.calls == 0
    gone, out = evaluate(only_b, state, CFG)
    assert out == [] and "job-a" not in gone.judged and "job-a" not in gone.rank_features


def later(inputs, dt):
    """The same job `dt` seconds later, with a push from rank 0 (something new: it is judged)."""
    ranks = inputs.jobs["job-a"]
    pushed = {**ranks, 0: replace(ranks[0], last_push=ranks[0].last_push + dt)}
    return replace(inputs, now=inputs.now + dt, jobs={"job-a": pushed})


def test_a_judgement_on_arrival_takes_what_fires_at_once_and_leaves_the_rest_to_the_periodic_evaluation():
    healthy, slow = build(), build(gpu={3: {"sm_clock_hz": 1.4e9}})  # a low clock: a windowed finding
    state, out = evaluate(slow, DetectorState(), CFG)
    flagged = [c for c in out if c.kind == "straggler" and c.rank == 3]
    assert flagged and not (flagged[0].sustained or flagged[0].corroborated)
    # judged on arrival with the clock back: the periodic evaluation's flag stands until the next one
    state, out = evaluate(later(healthy, 1), state, CFG, arrivals=True)
    assert out == flagged and state.judged["job-a"].arrival
    state, out = evaluate(later(healthy, 5), state, CFG)
    assert out == []
    # and the other way: slow on arrival is not flagged until a periodic evaluation sees it
    state, out = evaluate(later(slow, 6), state, CFG, arrivals=True)
    assert out == []
    # a periodic evaluation judges again after a judgement on arrival, though nothing is new since
    state, out = evaluate(replace(later(slow, 6), now=slow.now + 10), state, CFG)
    assert [c.key for c in out] == [c.key for c in flagged]
    # what fires at once is taken on arrival
    _, out = evaluate(starved(), DetectorState(), CFG, arrivals=True)
    assert [(c.kind, c.rank, c.sustained) for c in out] == [("io_starved_rank", 5, True)]


def test_a_judgement_on_arrival_judges_the_new_steps_against_the_last_periodic_picture_without_measuring_windows():
    # Periodic: a healthy job. On arrival, 6 s later, rank 5 has computed 2x for its last four steps: sequential
    # evidence, which fires at once. The windows are not measured again (no rank or GPU features; no GPU window is
    # even there to read): the windowed picture is the periodic judgement's.
    fns = FeatureFns(ranks=Counting(), gpus=Counting(gpu_features_many))
    state, out = evaluate(share_job(NOW - 6), DetectorState(), CFG, fns)
    assert out == [] and fns.ranks.calls == 1 and fns.gpus.calls == 1
    slow = share_job(NOW, compute=lambda r, k: 0.8 * (2.0 if r == 5 and k >= 116 else 1.0))
    state, out = evaluate(replace(slow, gpu_windows={}), state, CFG, fns, arrivals=True)
    assert [(c.kind, c.rank, c.sustained) for c in out] == [("straggler", 5, True)]
    assert fns.ranks.calls == 1 and fns.gpus.calls == 1
    assert state.judged["job-a"].arrival and state.rank_features["job-a"]  # what the service exports stays
    # The next periodic run measures the windows again.
    evaluate(replace(slow, now=NOW + 4), state, CFG, fns)
    assert fns.ranks.calls == 2 and fns.gpus.calls == 2


def test_a_judgement_on_arrival_after_a_fetch_measures_the_gpus_again():
    # Telemetry is fetched on its own schedule: a fetch that landed since the periodic picture is read, not
    # missed until the next periodic run (a GPU that began to throttle is a cause on it now).
    fns = FeatureFns(ranks=Counting(), gpus=Counting(gpu_features_many))
    state, _ = evaluate(share_job(NOW - 6), DetectorState(), CFG, fns)
    newer = replace(later(share_job(NOW - 6), 2), telemetry_seq=1)
    state, _ = evaluate(newer, state, CFG, fns, arrivals=True)
    assert fns.ranks.calls == 1 and fns.gpus.calls == 2  # the GPUs, not the ranks' steps over the window
    # and its picture serves the next judgement on arrival while no fetch lands
    evaluate(later(newer, 1), state, CFG, fns, arrivals=True)
    assert fns.ranks.calls == 1 and fns.gpus.calls == 2


def test_the_job_baseline_follows_drift_at_most_every_accumulate_every_s_however_often_it_is_judged():
    from gpumond.rules.detectors.job import JobBaseline, job_slowdown

    base = JobBaseline(1.0, 100, at=1000.0)
    drifting = [1.02] * 20  # within half the slowdown ratio: drift to follow
    kept, _ = job_slowdown("j", drifting, base, CFG, now=1000.0 + CFG.accumulate_every_s / 5)
    assert kept == base  # judged a second later: no step of drift
    followed, _ = job_slowdown("j", drifting, base, CFG, now=1000.0 + CFG.accumulate_every_s)
    assert followed.step_time_s > 1.0 and followed.at == 1000.0 + CFG.accumulate_every_s
