"""GPM activity read from the GPU windows' columns gives exactly what reading the samples one by one gives, and
a job whose live samples carry no GPM costs no per-GPU work at all."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gpumond.rules.columns import gpu_columns
from gpumond.rules.detectors.activity import _JobActivity, _from_columns, with_activity_many
from gpumond.rules.detectors.candidate import Candidate
from gpumond.rules.detectors.stats import median
from gpumond.rules.store import GpuStore
from gpumond.rules.types import GpuSample, GpuWindow, TelemetryBatch

KEYS = ("sm_active", "tensor_active")
UUIDS = [f"GPU-{i}" for i in range(9)]
# Few levels so medians tie and average; ±0.0 because `sorted` keeps their input order and so must the columns.
LEVEL = st.one_of(st.sampled_from([0.0, -0.0, 0.25, 0.5, 1.0]), st.floats(0.0, 1.0))


def reference(windows, job_gpus, since):
    """activity's definition: the median of each key over a GPU's live samples (up, t >= since) carrying it."""
    out = {k: {} for k in KEYS}
    for u in job_gpus:
        live = [s for s in windows.get(u, ()) if s.up and s.t >= since]
        for k in KEYS:
            xs = [s.values[k] for s in live if k in s.values]
            if xs:
                out[k][u] = median(xs)
    return out


@st.composite
def window(draw, uuid, gpm, nan):
    samples = []
    for _ in range(draw(st.integers(0, 8))):
        v = {"utilization": 0.9}
        for k in KEYS:
            if gpm and draw(st.booleans()):
                v[k] = math.nan if nan and draw(st.integers(0, 5)) == 0 else draw(LEVEL)
        samples.append(GpuSample(uuid, "n0", "0", float(draw(st.integers(0, 30))), draw(st.integers(0, 3)) > 0, v))
    return tuple(sorted(samples, key=lambda s: s.t))


@st.composite
def job(draw, nan=False):
    """Windows (some GPUs with GPM, some without, down samples, samples older than since), the job's GPUs in a
    drawn order (some without telemetry), and since."""
    present = draw(st.lists(st.sampled_from(UUIDS), unique=True, max_size=len(UUIDS)))
    windows = {u: draw(window(u, draw(st.booleans()), nan)) for u in present}
    job_gpus = {u: "n0" for u in draw(st.permutations(UUIDS))[:draw(st.integers(0, len(UUIDS)))]}
    return windows, job_gpus, float(draw(st.integers(-1, 31)))


def with_columns(windows):
    return {u: GpuWindow(w, gpu_columns(w)) for u, w in windows.items()}


@settings(max_examples=150, deadline=None)  # ~1.5 s on a shared 2-core machine
@given(job())
def test_the_columns_give_the_samples_values_exactly_and_in_job_order(drawn):
    windows, job_gpus, since = drawn
    got = _from_columns(list(job_gpus), [with_columns(windows).get(u, ()) for u in job_gpus], since)
    assert got is not None  # NaN-free windows that all have columns never leave the columns path
    want = reference(windows, job_gpus, since)
    # repr: the order of the GPUs and the sign of a zero median count, and 0.0 == -0.0 would hide the latter.
    assert repr(got) == repr(want)
    for k in KEYS:
        assert repr(_JobActivity(with_columns(windows), job_gpus, since).values(k)) == repr(want[k])
        assert repr(_JobActivity(windows, job_gpus, since).values(k)) == repr(want[k])  # the objects path


@settings(max_examples=80, deadline=None)
@given(job(nan=True))
def test_a_nan_activity_takes_the_objects_path_and_the_evidence_is_the_same(drawn):
    windows, job_gpus, since = drawn
    nan_live = any(math.isnan(s.values.get(k, 0.0)) for u in job_gpus for s in windows.get(u, ())
                   if s.up and s.t >= since for k in KEYS)
    got = _from_columns(list(job_gpus), [with_columns(windows).get(u, ()) for u in job_gpus], since)
    assert (got is None) == nan_live  # a NaN only on a sample that is not live changes nothing
    candidates = [Candidate("straggler", "j", "n0", i, u) for i, u in enumerate(job_gpus)]
    assert (repr(with_activity_many(candidates, with_columns(windows), job_gpus, since))
            == repr(with_activity_many(candidates, windows, job_gpus, since)))


class _Unreadable:
    """A sample that must not be read: the columns hold everything the activity needs."""

    def __getattr__(self, name):
        raise AssertionError(f"sample read for {name}")


def _columns_only(windows, readable=()):
    """The windows with their columns but unreadable samples, except those of the GPUs `readable`."""
    return {u: GpuWindow(w if u in readable else [_Unreadable()] * len(w), gpu_columns(w))
            for u, w in windows.items()}


def test_without_gpm_no_sample_is_read_and_there_is_nothing_to_add():
    windows = {u: tuple(GpuSample(u, "n0", "0", float(t), True, {"utilization": 0.9}) for t in range(12))
               for u in UUIDS}
    # GPM only on samples that are not live: down, or older than since.
    windows["GPU-0"] = (GpuSample("GPU-0", "n0", "0", 1.0, True, {"sm_active": 0.5}),
                        GpuSample("GPU-0", "n0", "0", 5.0, False, {"sm_active": 0.5}))
    job_gpus = dict.fromkeys(UUIDS, "n0")
    c = Candidate("straggler", "j", "n0", 3, "GPU-3")
    # The candidate's own samples are read, for its NVLink replay rate: one GPU, not the job's.
    assert with_activity_many([c], _columns_only(windows, readable={"GPU-3"}), job_gpus, since=2.0) == [c]


def test_with_gpm_the_values_come_from_the_columns_alone():
    windows = {u: tuple(GpuSample(u, "n0", "0", float(t), True, {"sm_active": 0.1 * i, "tensor_active": 0.05 * t})
                        for t in range(6)) for i, u in enumerate(UUIDS)}
    job = _JobActivity(_columns_only(windows), dict.fromkeys(UUIDS, "n0"), since=2.0)
    assert job.values("sm_active") == {u: 0.1 * i for i, u in enumerate(UUIDS)}
    assert job.values("tensor_active") == dict.fromkeys(UUIDS, 0.5 * (0.05 * 3 + 0.05 * 4))


def test_the_stores_windows_take_the_columns_path_with_the_objects_paths_answer():
    store = GpuStore(window_s=60.0, expire_after_s=300.0, max_gpus=64, max_samples=32)
    for t in range(20):
        store.add(TelemetryBatch(float(t), tuple(
            GpuSample(u, "n0", "0", float(t), t % 7 != 3, {"sm_active": ((i * 7 + t * 3) % 11) / 10} if i % 3 else {})
            for i, u in enumerate(UUIDS))))
    since = 4.0
    windows = store.windows(UUIDS, 0.0)
    assert all(w.columns is not None for w in windows.values())
    job_gpus = dict.fromkeys(reversed(UUIDS), "n0")
    got = _from_columns(list(job_gpus), [windows[u] for u in job_gpus], since)
    assert got is not None and repr(got) == repr(reference(windows, job_gpus, since))
    assert list(got["sm_active"]) == [u for u in job_gpus if UUIDS.index(u) % 3]


def test_windows_too_ragged_for_one_matrix_take_the_objects_path():
    # One long window among thousands of one-sample ones: the padded matrix would be mostly padding.
    windows = {f"G{i}": (GpuSample(f"G{i}", "n0", "0", 1.0, True, {"sm_active": (i % 7) / 10}),) for i in range(5000)}
    windows["G0"] = tuple(GpuSample("G0", "n0", "0", float(t), True, {"sm_active": 0.9}) for t in range(40))
    job_gpus = dict.fromkeys(windows, "n0")
    columns = with_columns(windows)
    assert _from_columns(list(job_gpus), [columns[u] for u in job_gpus], 0.0) is None
    c = Candidate("straggler", "j", "n0", 0, "G0")
    (got,) = with_activity_many([c], columns, job_gpus, 0.0)
    assert got.evidence == {"sm_active": 0.9, "peer_median_sm_active": 0.3}
