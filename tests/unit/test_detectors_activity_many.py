"""with_activity_many: a job's candidates at once give what the pre-batch per-candidate code gave, and a
job's telemetry is read once however many candidates it has."""

from collections.abc import Mapping
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpumond.rules.detectors.activity import (NVLINK_CAUSE, NVLINK_REPLAY_PER_S, _PER_GPU, activity, replay_rate,
                                              with_activity_many)
from gpumond.rules.detectors.candidate import Candidate
from gpumond.rules.detectors.stats import median
from gpumond.rules.types import GpuSample


def _reference(c, gpu_windows, job_gpus, since):
    """with_activity as it was before candidates were batched (one candidate, every window read again)."""
    windows = {u: [s for s in gpu_windows.get(u, ()) if s.up and s.t >= since] for u in job_gpus}
    evidence = dict(c.evidence)
    if c.kind in _PER_GPU and c.gpu_uuid in windows:
        mine = windows[c.gpu_uuid]
        for key in ("sm_active", "tensor_active"):
            value = activity(mine, key)
            peers = [v for u, w in windows.items() if u != c.gpu_uuid and (v := activity(w, key)) is not None]
            if value is not None:
                evidence[key] = round(value, 3)
                if peers:
                    evidence[f"peer_median_{key}"] = round(median(peers), 3)
        rate = replay_rate(mine)
        if rate is not None and rate >= NVLINK_REPLAY_PER_S:
            evidence["nvlink_replays_per_s"] = round(rate, 1)
            evidence.setdefault("likely_cause", NVLINK_CAUSE)
    elif c.kind == "straggler_node" and c.node is not None:
        rates = {u: r for u, node in job_gpus.items() if node == c.node
                 and (r := replay_rate(windows[u])) is not None and r >= NVLINK_REPLAY_PER_S}
        if rates:
            evidence["nvlink_replays_per_s"] = {u: round(r, 1) for u, r in sorted(rates.items())}
            evidence.setdefault("likely_cause", NVLINK_CAUSE)
    return c if evidence == c.evidence else replace(c, evidence=evidence)


UUIDS = [f"GPU-{i}" for i in range(7)]
NODES = ["n0", "n1", "n2"]
# Few distinct levels, so ties between a candidate's own value and its peers' are common; NaN in a tenth of jobs.
LEVEL = st.one_of(st.sampled_from([0.0, 0.25, 0.5, 0.8, 1.0]), st.floats(0.0, 1.0))
NAN = st.one_of(LEVEL, st.just(float("nan")))


@st.composite
def _samples(draw, uuid, level):
    values = []
    for i in range(draw(st.integers(0, 6))):
        v = {}
        for key in ("sm_active", "tensor_active"):
            if draw(st.booleans()):
                v[key] = draw(level)
        if draw(st.booleans()):
            v["nvlink_replays_total"] = draw(st.sampled_from([0.0, 5.0, 1e4, 3e4, 1e9]))
        values.append(GpuSample(uuid, "n0", "0", float(draw(st.integers(0, 40))), draw(st.booleans()) or i % 2, v))
    return tuple(sorted(values, key=lambda s: s.t))


@st.composite
def _job(draw):
    present = draw(st.lists(st.sampled_from(UUIDS), unique=True, min_size=1, max_size=len(UUIDS)))
    level = NAN if draw(st.integers(0, 9)) == 0 else LEVEL
    windows = {u: draw(_samples(u, level)) for u in present}
    # The job's GPUs: mostly ones with telemetry, now and then one without.
    peers = draw(st.lists(st.sampled_from(present), unique=True)) + draw(st.lists(st.sampled_from(UUIDS), max_size=1))
    job_gpus = {u: draw(st.sampled_from(NODES)) for u in peers}
    kinds = st.sampled_from(sorted(_PER_GPU) + ["straggler_node", "job_slowdown"])
    candidates = draw(st.lists(st.builds(
        Candidate, kind=kinds, job=st.just("j"), node=st.one_of(st.none(), st.sampled_from(NODES)),
        gpu_uuid=st.one_of(st.none(), st.sampled_from(peers or UUIDS), st.sampled_from(UUIDS)),
        evidence=st.sampled_from([{}, {"likely_cause": "thermal"}, {"sm_active": 0.1}])), max_size=8))
    return candidates, windows, job_gpus, float(draw(st.integers(-1, 30)))


@settings(max_examples=200, deadline=None)  # ~1.5 s
@given(_job())
def test_batched_evidence_is_the_per_candidate_evidence(job):
    candidates, windows, job_gpus, since = job
    got = with_activity_many(candidates, windows, job_gpus, since)
    want = [_reference(c, windows, job_gpus, since) for c in candidates]
    assert repr(got) == repr(want)  # repr: NaN evidence compares unequal to itself
    assert [g is c for g, c in zip(got, candidates)] == [w is c for w, c in zip(want, candidates)]


class _Counting(Mapping):
    """GPU windows that count how often each GPU's window is read."""

    def __init__(self, windows):
        self.windows, self.reads = windows, {}

    def __getitem__(self, uuid):
        self.reads[uuid] = self.reads.get(uuid, 0) + 1
        return self.windows[uuid]

    def __iter__(self):
        return iter(self.windows)

    def __len__(self):
        return len(self.windows)


def test_a_jobs_windows_are_read_once_however_many_candidates_it_has():
    uuids = [f"GPU-{i:02d}" for i in range(16)]
    windows = _Counting({u: tuple(GpuSample(u, f"n{i // 8}", str(i % 8), float(t), True,
                                            {"sm_active": 0.5 + 0.01 * i, "tensor_active": 0.3,
                                             "nvlink_replays_total": 100.0 * t})
                                  for t in range(10)) for i, u in enumerate(uuids)})
    job_gpus = {u: f"n{i // 8}" for i, u in enumerate(uuids)}
    candidates = ([Candidate("straggler_node", "j", "n1")]  # its GPUs read before the job's activity is
                  + [Candidate("straggler", "j", job_gpus[u], i, u) for i, u in enumerate(uuids[:6])]
                  + [Candidate("straggler_node", "j", "n0")])
    out = with_activity_many(candidates, windows, job_gpus, since=0.0)
    assert all(c.evidence["likely_cause"] == NVLINK_CAUSE for c in out)
    assert out[1].evidence["peer_median_sm_active"] == 0.58  # 15 peers: GPU-01..15, middle one GPU-08
    assert windows.reads == {u: 1 for u in uuids}


def test_with_a_nan_among_the_peers_the_median_is_the_per_candidate_one():
    # NaN makes a sorted order depend on the input order: leaving one value out of the job's sorted
    # values would give 0.3 here, the peers as they come give NaN (the reference's answer).
    job_gpus = {f"GPU-{i}": "n0" for i in range(5)}
    windows = {u: (GpuSample(u, "n0", "0", 1.0, True, {"sm_active": v}),)
               for u, v in zip(job_gpus, (0.9, float("nan"), 0.9, 0.5, 0.1))}
    c = Candidate("straggler", "j", "n0", 4, "GPU-4")
    (got,) = with_activity_many([c], windows, job_gpus, since=0.0)
    assert repr(got) == repr(_reference(c, windows, job_gpus, 0.0))
    assert got.evidence["sm_active"] == 0.1
