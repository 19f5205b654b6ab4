"""The vectorised feature code (rank_batch, gpu_batch) gives exactly what a straightforward per-rank,
per-GPU implementation gives, on generated edge cases and on simulated clusters with planted faults.

The reference below is the detectors' feature code as it was before vectorisation, kept here verbatim
in spirit (one Python loop per rank / GPU) so the production fallback cannot drift with the fast path.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.detection.cluster import Cluster, JobSpec
from benchmarks.detection.faults import Fault
from benchmarks.detection.noise import Noise
from benchmarks.detection.scenarios import T0
from gpumond.rules.columns import gpu_columns, step_columns
from gpumond.rules.detectors import engine
from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.features import THROTTLE_SIGNALS, GpuFeatures, RankFeatures
from gpumond.rules.detectors import gpu_batch
from gpumond.rules.detectors.gpu_batch import gpu_features_many
from gpumond.rules.detectors.rank_batch import job_rank_features
from gpumond.rules.types import GpuSample, GpuWindow, RankInfo, RankWindow, StepRecord


# ----- reference: one Python loop per rank / GPU -------------------------------------------------
def _median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _trimmed(xs, trim):
    s = sorted(xs)
    g = int(trim * len(s))
    if trim > 0 and len(s) >= 3:
        g = max(g, 1)  # at least one off each end, so that one step cannot move the mean
    total = 0.0
    for x in s[g:len(s) - g]:
        total += x
    return total / (len(s) - 2 * g)


def ref_means(windows, since):
    """Each step's mean share over the ranks, summed at 2**-30 resolution (exact in any order)."""
    per_step = {}
    for w in windows:
        for s in w.steps:
            if s.end >= since and s.duration_s > 0 and s.comm_wait_s is not None:
                x = max(1.0 - (s.data_wait_s + s.comm_wait_s) / s.duration_s, 0.0)
                per_step.setdefault(s.step, []).append(round(x * 2.0**30) / 2.0**30)
    return {k: math.fsum(v) / len(v) for k, v in per_step.items()}


def ref_rank(w: RankWindow, since: float, short: int = 8, least: int = 5, trim: float = 0.1,
             short_s: float = 0.0, means=None) -> RankFeatures:
    recent = [s for s in w.steps if s.end >= since]
    durations = [s.duration_s for s in recent if s.duration_s > 0]
    waits = [min(s.data_wait_s / s.duration_s, 1.0) for s in recent if s.duration_s > 0]
    timed = [s for s in recent if s.duration_s > 0 and s.comm_wait_s is not None]
    absolute = [max(1.0 - (s.data_wait_s + s.comm_wait_s) / s.duration_s, 0.0) for s in timed]
    shares = [x - (means or {}).get(s.step, 0.0) for s, x in zip(timed, absolute)]
    comm = [s.comm_wait_s / s.duration_s for s in timed]
    last = len(shares) - short
    newest = max((s.end for s in timed), default=0.0)  # the latest end: steps may come out of order
    in_short = [x for i, (s, x) in enumerate(zip(timed, shares)) if i >= last or s.end >= newest - short_s]
    return RankFeatures(w.info.rank, w.info.node, w.info.gpu_uuid, w.info.group, len(recent),
                        _median(durations) if durations else None, _median(waits) if waits else None,
                        max((s.end for s in w.steps), default=None), w.last_push,
                        sum(waits) / len(waits) if waits else None,
                        _median(in_short) if shares and len(shares) >= min(short, least) else None,
                        _median(shares) if len(shares) >= least else None,
                        _trimmed(shares, trim) if len(shares) >= least else None,
                        _median(absolute) if len(shares) >= least else None,
                        _median(comm) if len(shares) >= least else None,
                        share_spread=_median([abs(x - _median(shares)) for x in shares]) if len(shares) >= least
                        else None, share_n=len(shares), share_short_n=len(in_short))


def ref_step_times(ranks, since, until):
    per_step = {}
    for w in ranks.values():
        for s in w.steps:
            if since <= s.end < until:
                per_step[s.step] = max(per_step.get(s.step, 0.0), s.duration_s)
    return [per_step[k] for k in sorted(per_step)]


def _ratio(samples, num, den):
    xs = [s.values[num] / s.values[den] for s in samples if num in s.values and s.values.get(den, 0) > 0]
    return _median(xs) if xs else None


def _med(samples, key):
    xs = [s.values[key] for s in samples if key in s.values]
    return _median(xs) if xs else None


def _energy(samples):
    xs = [(s.t, s.values["energy_j"], s.values.get("power_limit_w", 0.0)) for s in samples if "energy_j" in s.values]
    if len(xs) < 3 or xs[-1][0] <= xs[0][0] or xs[-1][1] < xs[0][1]:
        return None
    limit = _median([x[2] for x in xs])
    return (xs[-1][1] - xs[0][1]) / (xs[-1][0] - xs[0][0]) / limit if limit > 0 else None


def ref_gpu(uuid: str, samples) -> GpuFeatures:
    live = [s for s in samples if s.up]
    node = samples[-1].node
    if not live:
        return GpuFeatures(uuid, node, 0, samples[-1].up, None, None, None, None, None)
    throttled = [s for s in live if any(s.values.get(k, 0) >= 0.5 for k in THROTTLE_SIGNALS)]
    has_throttle = any(k in s.values for s in live for k in THROTTLE_SIGNALS)
    reasons = sorted({k.removeprefix("throttle_") for s in throttled for k in THROTTLE_SIGNALS
                      if s.values.get(k, 0) >= 0.5})
    busy = [s for s in live if s.values.get("utilization", 1.0) >= 0.5] or live
    return GpuFeatures(uuid, node, len(live), samples[-1].up, _ratio(busy, "sm_clock_hz", "sm_clock_max_hz"),
                       _energy(live) or _ratio(live, "power_w", "power_limit_w"), _med(live, "utilization"),
                       _med(live, "temperature_c"), len(throttled) / len(live) if has_throttle else None,
                       tuple(reasons),
                       # the newest live sample's time when it and the live one before it show a reason
                       live[-1].t if len(live) >= 2 and all(any(s.values.get(k, 0) >= 0.5 for k in THROTTLE_SIGNALS)
                                               for s in live[-2:]) else None)


def ref_gpus(uuids, windows, after, strict=False):
    out = {}
    for u in uuids:
        samples = [s for s in windows.get(u, ()) if (s.t > after if strict else s.t >= after)]
        if samples:
            out[u] = ref_gpu(u, samples)
    return out


def same(a, b) -> bool:
    """Equal, with NaN equal to NaN and the same type for every float field (a median stays a float)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, (RankFeatures, GpuFeatures)):
        return type(a) is type(b) and all(same(getattr(a, f), getattr(b, f)) for f in a.__slots__)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


# ----- generated edge cases ----------------------------------------------------------------------
NOW = 1000.0
SINCE = NOW - 60.0
# Few distinct values so ties, zeros, exact thresholds (0.5, the window edge) and empty groups are common.
times = st.sampled_from([SINCE - 30.0, SINCE - 0.5, SINCE, SINCE + 0.25, NOW - 20.0, NOW - 1.0, NOW, NOW + 3.0])
amounts = st.one_of(st.sampled_from([0.0, -0.0, 0.5, 1.0, 2.0, 1e-300]), st.floats(0.0, 50.0, allow_nan=False))
step = st.builds(StepRecord, st.integers(0, 40), times, amounts, amounts, st.none(), st.one_of(st.none(), amounts))


@st.composite
def jobs(draw):
    ranks = {}
    for r in range(draw(st.integers(0, 7))):
        info = RankInfo("j", r, 8, f"n{r // 3}", f"G{r}", draw(st.sampled_from([None, "a"])))
        ranks[r] = RankWindow(info, tuple(draw(st.lists(step, max_size=12))), NOW - r)
    return ranks


def with_columns(ranks, every=True):
    """The same windows carrying StepColumns (all of them, or all but the last: the objects path)."""
    out = {r: dataclasses.replace(w, columns=step_columns(w.steps)) for r, w in ranks.items()}
    if not every and out:
        last = list(out)[-1]
        out[last] = dataclasses.replace(out[last], columns=None)
    return out


def without_columns(inputs: engine.EvalInputs) -> engine.EvalInputs:
    """The same inputs as plain objects: windows without columns, GPU windows as plain tuples."""
    jobs = {j: {r: dataclasses.replace(w, columns=None) for r, w in ranks.items()} for j, ranks in inputs.jobs.items()}
    gpus = {u: tuple(w) for u, w in inputs.gpu_windows.items()}
    return dataclasses.replace(inputs, jobs=jobs, gpu_windows=gpus)


@settings(max_examples=400, deadline=None)
@given(jobs(), st.booleans(), st.sampled_from([0.0, 3.0, 20.0]))
def test_rank_features_and_step_times_match_the_reference(ranks, every, short_s):
    means = ref_means(ranks.values(), SINCE)
    expected = ([ref_rank(w, SINCE, short_s=short_s, means=means) for w in ranks.values()],
                ref_step_times(ranks, SINCE, NOW))
    for variant in (ranks, with_columns(ranks, every)):  # the objects path, then the columns path
        feats, step_times = job_rank_features(variant, SINCE, NOW, short_s=short_s)
        assert same(feats, expected[0])
        assert same(step_times, expected[1])


def test_rank_features_fall_back_on_nan_and_huge_step_numbers():
    info = RankInfo("j", 0, 1, "n", "G")
    for steps in ((StepRecord(1, NOW, math.nan, 0.0), StepRecord(2, NOW, 1.0, 0.0)),
                  (StepRecord(2**60, NOW, 1.0, 0.0), StepRecord(3, NOW - 1, 2.0, 0.0)),
                  (StepRecord(2**70, NOW, 1.0, 0.0), StepRecord(3, NOW - 1, 2.0, 0.0))):
        plain = {0: RankWindow(info, steps, NOW)}
        for ranks in (plain, with_columns(plain)):
            feats, step_times = job_rank_features(ranks, SINCE, NOW + 1)
            assert same(feats, [ref_rank(ranks[0], SINCE)])
            assert same(step_times, ref_step_times(ranks, SINCE, NOW + 1))


FULL = ("sm_clock_hz", "sm_clock_max_hz", "power_w", "power_limit_w", "utilization", "temperature_c",
        *THROTTLE_SIGNALS)
level = st.sampled_from([0.0, -0.0, 0.25, 0.5, 0.75, 1.0, 2.0, 700.0])
sample_time = st.sampled_from([SINCE - 5.0, SINCE, SINCE + 1.0, SINCE + 10.0, NOW - 7.0, NOW - 7.0, NOW])


@st.composite
def sample_values(draw, shape):
    if shape == "full":
        keys = list(FULL)
    elif shape == "energy":
        keys = [*FULL, "energy_j"]
    elif shape in ("no throttle", "no throttle, energy"):  # clock-event series dropped before the rules service
        keys = [k for k in FULL if k not in THROTTLE_SIGNALS] + ["energy_j"] * shape.endswith("energy")
    else:  # anything: missing signals, extra keys
        keys = draw(st.lists(st.sampled_from([*FULL, "energy_j", "throttle_sw_power_cap"]), unique=True))
    return {k: draw(st.one_of(level, st.floats(0.0, 1e4, allow_nan=False))) for k in keys}


@st.composite
def gpu_windows(draw):
    shape = draw(st.sampled_from(["full", "energy", "no throttle", "no throttle, energy", "mixed"]))
    windows = {}
    for g in range(draw(st.integers(0, 6))):
        samples = []
        for _ in range(draw(st.integers(0, 8))):
            up = draw(st.booleans()) if draw(st.integers(0, 3)) == 0 else True
            values = draw(sample_values(shape if shape != "mixed" or g % 2 else "any"))
            samples.append(GpuSample(f"G{g}", f"n{g // 2}", str(g), draw(sample_time), up, values))
        windows[f"G{g}"] = tuple(samples)
    return windows


def with_gpu_columns(windows, every=True):
    """The same GPU windows carrying GpuColumns (all of them, or all but the first: the objects path)."""
    out = {u: GpuWindow(w, gpu_columns(w)) for u, w in windows.items()}
    if not every and out:
        first = next(iter(out))
        out[first] = tuple(out[first])
    return out


@settings(max_examples=150, deadline=None)  # each example builds whole GPU windows twice: ~60 ms
@given(gpu_windows(), st.booleans(), st.booleans())
def test_gpu_features_match_the_reference(windows, strict, every):
    uuids = [*windows, "G-unknown", *list(windows)[:1]]  # a GPU without telemetry, a GPU asked twice
    expected = ref_gpus(uuids, windows, SINCE, strict)
    for variant in (windows, with_gpu_columns(windows, every)):  # the objects path, then the columns path
        assert same(gpu_features_many(uuids, variant, SINCE, strict), expected)


def test_gpu_features_edge_cases():
    def s(t, up=True, **kv):
        base = dict.fromkeys(FULL, 0.0) | {"sm_clock_max_hz": 100.0, "power_limit_w": 700.0, "utilization": 1.0}
        return GpuSample("G", "n", "0", t, up, base | kv)
    cases = {
        "single sample": (s(NOW),),
        "all down": (s(NOW, up=False), s(NOW - 1, up=False)),
        "zero limits": tuple(s(NOW - i, power_limit_w=0.0, sm_clock_max_hz=0.0) for i in range(5)),
        "energy reset": tuple(s(NOW - 10 + i, energy_j=1e6 - 900 * i * (i < 3)) for i in range(5)),
        "energy flat (falls back to sampled power)": tuple(s(NOW - 10 + i, energy_j=5.0, power_w=300.0) for i in range(5)),
        "energy, time still": tuple(s(NOW, energy_j=float(i)) for i in range(4)),
        "energy, rising": tuple(s(NOW - 10 + i, energy_j=600.0 * i) for i in range(6)),
        "idle clocks": tuple(s(NOW - i, utilization=0.1 * i, sm_clock_hz=10.0 * i) for i in range(8)),
        "throttled": tuple(s(NOW - i, throttle_hw_thermal=float(i % 2), throttle_hw_power_brake=0.5) for i in range(4)),
        "throttled in the newest two": tuple(s(NOW - 3 + i, throttle_hw_slowdown=float(i >= 2)) for i in range(4)),
        "throttled in the newest only": tuple(s(NOW - 3 + i, throttle_sw_thermal=float(i == 3)) for i in range(4)),
        "throttled, newest down": (*(s(NOW - 3 + i, throttle_hw_thermal=1.0) for i in range(3)),
                                   s(NOW, up=False)),
        "nan": (s(NOW, temperature_c=math.nan), s(NOW - 1)),
        "no throttle reasons": tuple(GpuSample("G", "n", "0", NOW - i, True, {
            k: v for k, v in s(NOW - i).values.items() if k not in THROTTLE_SIGNALS}) for i in range(4)),
        "no throttle reasons, energy": tuple(GpuSample("G", "n", "0", NOW - 10 + i, True, {
            k: v for k, v in s(NOW, energy_j=600.0 * i).values.items() if k not in THROTTLE_SIGNALS})
            for i in range(4)),
        "int values": tuple(s(NOW - i, temperature_c=70 + i) for i in range(3)),
    }
    for name, samples in cases.items():
        plain = {"G": samples}
        for strict in (False, True):
            for windows in (plain, with_gpu_columns(plain)):
                got = gpu_features_many(["G"], windows, SINCE, strict)
                assert same(got, ref_gpus(["G"], plain, SINCE, strict)) or name == "int values", name
    # ints: the fast path reads numbers as floats (telemetry sources only produce floats); values still equal
    windows = {"G": cases["int values"]}
    assert gpu_features_many(["G"], windows, SINCE) == ref_gpus(["G"], windows, SINCE)
    assert gpu_features_many(["G"], with_gpu_columns(windows), SINCE) == ref_gpus(["G"], windows, SINCE)


def test_gpus_without_throttle_reasons_stay_on_the_vectorised_path():
    # A fleet whose Prometheus drops the clock-event series: every GPU at once, not one by one (the per-GPU path
    # was 2.0 s of a 33,000-GPU evaluation in benchmarks/fleet_scale.py).
    values = {"sm_clock_hz": 1.9e9, "sm_clock_max_hz": 1.98e9, "power_w": 600.0, "power_limit_w": 700.0,
              "utilization": 1.0, "temperature_c": 60.0}
    plain = {f"G{g}": tuple(GpuSample(f"G{g}", "n", str(g), NOW - i, True, values) for i in range(5)) for g in range(3)}
    windows = with_gpu_columns(plain)
    wins = [windows[u] for u in plain]
    got = gpu_batch._from_columns(list(plain), wins, SINCE, False)  # noqa: SLF001 - which path, not only what
    assert got is not None and got == ref_gpus(list(plain), plain, SINCE)
    assert {f.throttle_frac for f in got.values()} == {None}


# ----- whole evaluations on simulated clusters ---------------------------------------------------
def _reference_ranks(r, since, until, short, least, trim, short_s=0.0, steps=None):  # reads its own steps
    means = ref_means(r.values(), since)
    return [ref_rank(w, since, short, least, trim, short_s, means) for w in r.values()], ref_step_times(r, since, until)


REFERENCE = engine.FeatureFns(ranks=_reference_ranks, gpus=ref_gpus)


QUIET = Noise(ckpt_every_s=0.0)
SCENARIOS = {
    "slow gpu, throttled": ([Fault("slow_gpu", "job-0", T0 + 60, 1e6, rank=5, slowdown=1.5, visible=True,
                                   reason="hw_thermal")], Noise(), {}),
    "slow gpu, silent": ([Fault("slow_gpu", "job-0", T0 + 60, 1e6, rank=9, slowdown=1.25)], Noise(), {}),
    "slow node": ([Fault("slow_node", "job-0", T0 + 60, 1e6, node="node-00001", slowdown=1.25)], Noise(), {}),
    "starved rank": ([Fault("starved_rank", "job-0", T0 + 60, 1e6, rank=3, wait_frac=0.3, cause="storage")],
                     Noise(), {}),
    "starved job": ([Fault("starved_job", "job-0", T0 + 60, 1e6, wait_frac=0.2, cause="remote")], Noise(), {}),
    "hung rank": ([Fault("hung_rank", "job-0", T0 + 100, 1e6, rank=7)], QUIET, {}),
    "missing telemetry, stages": ([], Noise(sample_miss_p=0.2, node_miss_p=0.1, ckpt_every_s=60.0),
                                  {"stages": 2, "report_group": True}),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("energy", [True, False])
def test_evaluate_matches_the_reference_features(name, energy):
    faults, noise, job = SCENARIOS[name]
    cfg = DetectorConfig()
    fast_state = ref_state = objects_state = engine.DetectorState()
    c = Cluster([JobSpec("job-0", 4, **job)], faults, noise, seed=len(name), t0=T0, energy=energy)
    seen = set()
    for t in range(20, 260, 10):
        c.advance_to(T0 + t)
        inputs = c.inputs(T0 + t)
        ref_state, expected = engine.evaluate(inputs, ref_state, cfg, REFERENCE)
        fast_state, got = engine.evaluate(inputs, fast_state, cfg)  # the simulator's columns
        objects_state, from_objects = engine.evaluate(without_columns(inputs), objects_state, cfg)
        assert got == expected, (name, t)
        assert from_objects == expected, (name, t)
        assert fast_state == ref_state == objects_state
        seen.update(c.kind for c in got)
    if name in ("hung rank", "starved rank", "starved job", "slow gpu, throttled"):
        assert seen, "the scenario should produce candidates"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.tuples(sample_time, st.booleans(), st.sampled_from(["none", "nan", "partial"])),
                         min_size=1, max_size=8), min_size=1, max_size=5), st.booleans())
def test_samples_that_are_not_live_never_send_a_batch_to_the_objects_path(extra, strict):
    """Only live samples (up, in the look) decide whether the columns path can judge a batch: a down or older
    sample with no values, a NaN or a missing signal leaves every GPU on it, with the reference's results."""
    full = dict.fromkeys(FULL, 0.5) | {"sm_clock_max_hz": 100.0, "power_limit_w": 700.0}
    odd = {"none": {}, "nan": dict.fromkeys(FULL, math.nan), "partial": {"power_w": 1.0}}
    plain = {}
    for g, others in enumerate(extra):
        samples = [GpuSample(f"G{g}", "n", str(g), NOW - 1.0, True, full)]  # one live sample each
        for t, up, kind in others:
            in_look = t > SINCE if strict else t >= SINCE
            samples.append(GpuSample(f"G{g}", "n", str(g), t, up and not in_look, odd[kind]))  # never live
        samples.sort(key=lambda s: s.t)
        plain[f"G{g}"] = tuple(samples)
    windows = with_gpu_columns(plain)
    got = gpu_batch._from_columns(list(plain), [windows[u] for u in plain], SINCE, strict)  # noqa: SLF001
    assert got is not None
    assert same(got, ref_gpus(list(plain), plain, SINCE, strict))
