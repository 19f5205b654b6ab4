"""Incremental evaluation (engine.evaluate): a job with nothing new since its last judgement keeps that
judgement's candidates instead of being judged again; anything new, or `rejudge_s` of wall time, judges it."""

from dataclasses import replace

from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.engine import DetectorState, FeatureFns, evaluate
from gpumond.rules.detectors.rank_batch import job_rank_features

from tests.unit.detector_inputs import build

CFG = DetectorConfig()


class Counting:
    """The default rank features, counting the jobs they were computed for."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *a, **kw):
        self.calls += 1
        return job_rank_features(*a, **kw)


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
