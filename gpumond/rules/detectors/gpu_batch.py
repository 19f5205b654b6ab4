"""Many GPUs' features at once, vectorised with numpy: the same results as features.gpu_features.

A job's GPUs hold ~12 samples each; their values are read into one matrix with a C-level item getter
and every median is taken for all GPUs at once (ragged.Groups). The fast path needs each live sample to
carry every signal the features read, as the agent exports them; a GPU whose samples lack one (an older
driver, a partial scrape), or a batch with a NaN, goes to features.gpu_features, which stays the
reference. Numbers are treated as floats, as the telemetry sources produce them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain, compress, repeat
from operator import attrgetter, contains, itemgetter

import numpy as np

from gpumond.rules.detectors.features import THROTTLE_SIGNALS, GpuFeatures, gpu_features
from gpumond.rules.detectors.ragged import Groups, has_nan
from gpumond.rules.types import GpuSample

_BASE = ("sm_clock_hz", "sm_clock_max_hz", "power_w", "power_limit_w", "utilization", "temperature_c",
         *THROTTLE_SIGNALS)
_ENERGY = "energy_j"
CLK, CLK_MAX, POWER, LIMIT, UTIL, TEMP = range(6)
THR = slice(6, 6 + len(THROTTLE_SIGNALS))
_GET = {False: itemgetter(*_BASE), True: itemgetter(*_BASE, _ENERGY)}
_T = attrgetter("t")
_UP = attrgetter("up")
_VALUES = attrgetter("values")
# Sorted reason names for each bit pattern of THROTTLE_SIGNALS (bit j: signal j seen in some sample).
_REASONS = [tuple(sorted(k.removeprefix("throttle_") for j, k in enumerate(THROTTLE_SIGNALS) if m >> j & 1))
            for m in range(1 << len(THROTTLE_SIGNALS))]


def gpu_features_many(uuids: Sequence[str], windows: Mapping[str, Sequence[GpuSample]], after: float,
                      strict: bool = False) -> dict[str, GpuFeatures]:
    """{uuid: gpu_features(uuid, its samples at t >= after (t > after if strict))} for each GPU with any."""
    uuids = list(dict.fromkeys(uuids))
    wins = [windows.get(u, ()) for u in uuids]
    full = _vectorised(uuids, wins, after, strict, with_energy=None)
    if full is not None:
        return full
    # Some live sample lacks a signal: batch the GPUs whose samples are uniform, the rest one by one.
    out: dict[str, GpuFeatures] = {}
    kinds = [_kind(w, after, strict) for w in wins]
    for with_energy in (True, False):
        pick = [i for i, k in enumerate(kinds) if k is with_energy]
        part = _vectorised([uuids[i] for i in pick], [wins[i] for i in pick], after, strict, with_energy)
        assert part is not None  # every picked GPU's live samples carry every key read
        out.update(part)
    for u, w, k in zip(uuids, wins, kinds, strict=True):
        if k is None:
            samples = [s for s in w if (s.t > after if strict else s.t >= after)]
            if samples:
                out[u] = gpu_features(u, samples)
    return {u: out[u] for u in uuids if u in out}  # the callers' order, as the reference loop builds it


def _kind(window: Sequence[GpuSample], after: float, strict: bool) -> bool | None:
    """True: every live sample has all signals and energy; False: all signals and never energy; None: other."""
    live = [s.values for s in window if (s.t > after if strict else s.t >= after) and s.up]
    if all(all(k in v for k in _BASE) for v in live):
        energy = [_ENERGY in v for v in live]
        if all(energy):
            return True
        if not any(energy):
            return False
    return None


def _vectorised(uuids: list[str], wins: list[Sequence[GpuSample]], after: float, strict: bool,
                with_energy: bool | None) -> dict[str, GpuFeatures] | None:
    """The features of every GPU, or None when a live sample lacks a key read (with_energy: energy_j too)
    or, without energy, carries energy_j (which the reference would use). with_energy=None: as the first
    live sample has it (agents export energy, the service's mapping does not yet)."""
    counts = np.fromiter(map(len, wins), np.int64, len(wins))
    flat = list(chain.from_iterable(wins))
    t = np.fromiter(map(_T, flat), float, len(flat))
    if has_nan(t):
        return _reference(uuids, wins, after, strict)
    kept = t > after if strict else t >= after
    up = np.fromiter(map(_UP, flat), bool, len(flat))
    live = kept & up
    values = list(map(_VALUES, compress(flat, live.tolist())))
    if with_energy is None:
        with_energy = bool(values) and _ENERGY in values[0]
    try:
        rows = list(map(_GET[with_energy], values))
    except KeyError:
        return None
    if not with_energy and any(map(contains, values, repeat(_ENERGY))):
        return None
    x = np.array(rows, dtype=float).reshape(len(rows), len(_BASE) + with_energy)
    if has_nan(x):
        return _reference(uuids, wins, after, strict)
    windows = Groups(counts)
    n_kept = windows.count(kept)
    last_kept = np.full(len(uuids), -1, dtype=np.int64)
    np.maximum.at(last_kept, windows.row[kept], np.flatnonzero(kept))
    g = Groups(windows.count(live))
    cols = _columns(x, t[live], g, with_energy)

    out: dict[str, GpuFeatures] = {}
    for i, (u, n, last, n_live) in enumerate(zip(uuids, n_kept.tolist(), last_kept.tolist(), g.counts.tolist(),
                                                 strict=True)):
        if not n:
            continue
        s = flat[last]
        if not n_live:
            out[u] = GpuFeatures(u, s.node, 0, s.up, None, None, None, None, None)
            continue
        clock, power, util, temp, frac, reasons = (c[i] for c in cols)
        out[u] = GpuFeatures(uuid=u, node=s.node, samples=n_live, up=s.up, clock_ratio=clock, power_ratio=power,
                             utilization=util, temperature_c=temp, throttle_frac=frac,
                             throttle_reasons=_REASONS[reasons])
    return out


def _columns(x: np.ndarray, t: np.ndarray, g: Groups, with_energy: bool) -> list[list]:
    """Per GPU: clock ratio, power ratio, utilization, temperature (None where undefined), throttle fraction,
    and the bit pattern of throttle reasons seen."""
    hot = x[:, THR] >= 0.5
    bits = np.zeros(g.n, dtype=np.int64)
    for j in range(hot.shape[1]):
        bits |= g.any(hot[:, j]).astype(np.int64) << j
    frac = g.count(hot.any(axis=1)) / np.maximum(g.counts, 1)
    everyone = np.ones(len(x), dtype=bool)
    with np.errstate(all="ignore"):  # a zero limit divides by zero; such samples are masked out
        # An idle GPU's clock drops: use only samples with kernels running, unless there are none.
        busy = x[:, UTIL] >= 0.5
        judged = np.where(g.any(busy)[g.row], busy, True)
        clock, k_clock = g.median(x[:, CLK] / x[:, CLK_MAX], judged & (x[:, CLK_MAX] > 0))
        power, k_power = g.median(x[:, POWER] / x[:, LIMIT], x[:, LIMIT] > 0)
        if with_energy:
            mean_power, usable = _energy_ratio(x, t, g)
            power = np.where(usable, mean_power, power)
            k_power = np.where(usable, 1, k_power)  # defined wherever the counter gave it
    util, _ = g.median(x[:, UTIL], everyone)
    temp, _ = g.median(x[:, TEMP], everyone)
    return [_maybe(clock, k_clock), _maybe(power, k_power), util.tolist(), temp.tolist(), frac.tolist(),
            bits.tolist()]


def _energy_ratio(x: np.ndarray, t: np.ndarray, g: Groups) -> tuple[np.ndarray, np.ndarray]:
    """Mean power from the energy counter over the window / the median limit, and where it is usable:
    ≥ 3 samples, time moved forward, the counter did not reset, a positive limit, and non-zero (the
    reference's `or` falls back to the sampled power on 0.0)."""
    e = x[:, -1]
    limit, _ = g.median(x[:, LIMIT], np.ones(len(x), dtype=bool))
    t0, t1, e0, e1 = g.first(t), g.last(t), g.first(e), g.last(e)
    with np.errstate(all="ignore"):  # unusable groups may divide by zero; they are masked out
        ratio = (e1 - e0) / (t1 - t0) / limit
    usable = (g.counts >= 3) & (t1 > t0) & ~(e1 < e0) & (limit > 0)
    return ratio, usable & (ratio != 0)


def _maybe(values: np.ndarray, k: np.ndarray) -> list[float | None]:
    return [v if n else None for v, n in zip(values.tolist(), k.tolist(), strict=True)]


def _reference(uuids: list[str], wins: list[Sequence[GpuSample]], after: float,
               strict: bool) -> dict[str, GpuFeatures]:
    out = {}
    for u, w in zip(uuids, wins, strict=True):
        samples = [s for s in w if (s.t > after if strict else s.t >= after)]
        if samples:
            out[u] = gpu_features(u, samples)
    return out
