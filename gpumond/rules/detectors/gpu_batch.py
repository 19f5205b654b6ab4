"""Many GPUs' features at once, vectorised with numpy: the same results as features.gpu_features.

A job's GPUs hold ~12 samples each; their values are read into one matrix with a C-level item getter
and every median is taken for all GPUs at once (ragged.Groups). The fast path needs each live sample to
carry every signal the features read, as the agent exports them, or (from a GpuStore's columns) all of
them but the throttle reasons, on no sample at all (a Prometheus that drops the clock-event series); a GPU
whose samples lack one (an older driver, a partial scrape), or a batch with a NaN, goes to
features.gpu_features, which stays the reference. Numbers are treated as floats, as the telemetry sources produce them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import math
from itertools import chain, compress, repeat
from operator import attrgetter, contains, itemgetter

import numpy as np

from gpumond.rules.detectors.features import THROTTLE_SIGNALS, GpuFeatures, gpu_features
from gpumond.rules.detectors.ragged import (
    column_median,
    first_row,
    gather,
    has_nan,
    held,
    last_row,
    newest_first,
    to_matrix,
    too_ragged,
)
from gpumond.rules.types import GPU_SIGNALS, SAMPLE_ROWS, GpuColumns, GpuSample

_BASE = ("sm_clock_hz", "sm_clock_max_hz", "power_w", "power_limit_w", "utilization", "temperature_c",
         *THROTTLE_SIGNALS)
_ENERGY = "energy_j"
CLK, CLK_MAX, POWER, LIMIT, UTIL, TEMP = range(6)
THR = slice(6, 6 + len(THROTTLE_SIGNALS))
_GET = {False: itemgetter(*_BASE), True: itemgetter(*_BASE, _ENERGY)}
_READ = attrgetter("t", "up", "values")
_FIRST, _SECOND, _THIRD = itemgetter(0), itemgetter(1), itemgetter(2)
_PAD = GpuSample("", "", "", math.nan, False)  # fills the matrix where a GPU has fewer samples; masked
# GpuColumns rows of the core signals (clock … temperature), the throttle reasons when the samples carry them,
# energy when they carry it; and their presence bits. A source may carry no throttle reasons at all (an operator
# who drops gpumond_gpu_clocks_event_active at the Prometheus, an older driver): throttle_frac is then None.
_CORE = _BASE[:THR.start]
_ROWS = {(th, e): [3 + GPU_SIGNALS.index(k) for k in (*_CORE, *THROTTLE_SIGNALS[:len(THROTTLE_SIGNALS) * th],
                                                      *(_ENERGY,)[:e])]
         for th in (False, True) for e in (False, True)}
_CORE_BITS = sum(1 << GPU_SIGNALS.index(k) for k in _CORE)
_THROTTLE_BITS = sum(1 << GPU_SIGNALS.index(k) for k in THROTTLE_SIGNALS)
_ENERGY_BIT = 1 << GPU_SIGNALS.index(_ENERGY)
_EMPTY = GpuColumns(np.empty((SAMPLE_ROWS, 0)))  # a GPU without telemetry: no samples
# Sorted reason names for each bit pattern of THROTTLE_SIGNALS (bit j: signal j seen in some sample).
_REASONS = [tuple(sorted(k.removeprefix("throttle_") for j, k in enumerate(THROTTLE_SIGNALS) if m >> j & 1))
            for m in range(1 << len(THROTTLE_SIGNALS))]


def gpu_features_many(uuids: Sequence[str], windows: Mapping[str, Sequence[GpuSample]], after: float,
                      strict: bool = False) -> dict[str, GpuFeatures]:
    """{uuid: gpu_features(uuid, its samples at t >= after (t > after if strict))} for each GPU with any."""
    uuids = list(dict.fromkeys(uuids))
    wins = [windows.get(u, ()) for u in uuids]
    full = _from_columns(uuids, wins, after, strict)
    if full is None:
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
    n = len(wins)
    counts = np.fromiter(map(len, wins), np.int64, n)
    width = int(counts.max()) if n else 0
    if width == 0 or too_ragged(counts, width):
        return _reference(uuids, wins, after, strict)
    # One visit per sample object (they are far apart in memory); the tuples built here are not.
    read = list(map(_READ, newest_first(wins, _PAD)))
    t = to_matrix(np.fromiter(map(_FIRST, read), float, width * n), width, n)
    have = held(counts, width)
    if has_nan(t[have]):
        return _reference(uuids, wins, after, strict)
    kept = have & (t > after if strict else t >= after)
    live = kept & to_matrix(np.fromiter(map(_SECOND, read), bool, width * n), width, n)
    values = list(map(_THIRD, compress(read, live[::-1].ravel().tolist())))  # in newest-first order
    if with_energy is None:
        with_energy = bool(values) and _ENERGY in values[0]
    c = len(_BASE) + with_energy
    try:
        x_live = np.fromiter(chain.from_iterable(map(_GET[with_energy], values)), float, c * len(values))
    except KeyError:
        return None
    if not with_energy and any(map(contains, values, repeat(_ENERGY))):
        return None
    x_live = x_live.reshape(-1, c)
    if has_nan(x_live):
        return _reference(uuids, wins, after, strict)
    x = np.full((width * n, c), np.nan)
    x[live[::-1].ravel()] = x_live
    return _assemble(uuids, wins, to_matrix(x, width, n), t, kept, live, counts, True, with_energy)


def _from_columns(uuids: list[str], wins: list[Sequence[GpuSample]], after: float,
                  strict: bool) -> dict[str, GpuFeatures] | None:
    """The features from the windows' GpuColumns (one concatenation, index arithmetic), or None when a window
    has none or the samples are not the usual uniform ones (a signal missing, energy on some samples only,
    a NaN): those take the objects path, which handles every case."""
    cols = [getattr(w, "columns", None) if w else _EMPTY for w in wins]
    n = len(cols)
    if not n or None in cols:
        return None
    counts = np.fromiter(map(len, wins), np.int64, n)  # each window's length is its columns' (a C-level len)
    width = int(counts.max())
    if width == 0 or too_ragged(counts, width):
        return None
    data = np.concatenate([c.data for c in cols], axis=1)  # type: ignore[union-attr]
    stops = np.cumsum(counts)
    # width is the longest window, so every sample is in the matrix: checks over all of them or over the live
    # ones read the columns as they are (their order does not matter to them), not the strided gathered matrix.
    if has_nan(data[0]):
        return None
    t = gather(data[0], stops, counts, width, math.nan)
    kept = held(counts, width) & (t > after if strict else t >= after)
    live = kept & (gather(data[1], stops, counts, width, 0.0) != 0.0)
    live_at = (data[0] > after if strict else data[0] >= after) & (data[1] != 0.0)
    present = data[2][live_at].astype(np.int64)
    if not ((present & _CORE_BITS) == _CORE_BITS).all():
        return None
    throttle = present & _THROTTLE_BITS
    with_throttle = bool(len(throttle)) and bool((throttle == _THROTTLE_BITS).all())
    if not with_throttle and throttle.any():
        return None  # some reasons on some live samples only
    energy = (present & _ENERGY_BIT) != 0
    with_energy = bool(energy.all()) and bool(len(energy))
    if with_energy != bool(energy.any()):
        return None  # energy on some live samples only
    signals = data[_ROWS[with_throttle, with_energy]]
    if has_nan(signals[:, live_at]):
        return None
    x = np.moveaxis(gather(signals, stops, counts, width, math.nan), 0, -1)  # (width, n, signals)
    x[~live] = math.nan  # as the objects path builds it: only live samples are read
    return _assemble(uuids, wins, x, t, kept, live, counts, with_throttle, with_energy)


def _assemble(uuids: list[str], wins: list[Sequence[GpuSample]], x: np.ndarray, t: np.ndarray, kept: np.ndarray,
              live: np.ndarray, counts: np.ndarray, with_throttle: bool, with_energy: bool) -> dict[str, GpuFeatures]:
    """GpuFeatures per GPU from the (width, n, signals) matrix of live samples' values (the core signals
    [+ throttle reasons] [+ energy])."""
    width = t.shape[0]
    cols = _columns(x, t, live, with_throttle, with_energy)
    # The reference reports the node and up-state of the newest sample in the window, live or not.
    newest = last_row(kept) - (width - counts)  # its index in the GPU's window

    out: dict[str, GpuFeatures] = {}
    # One zip over the per-GPU columns: a generator per GPU to pick its values cost ~1 µs each at 32,768 GPUs.
    for u, w, n_kept, at, n_live, clock, power, util, temp, frac, reasons, hot_newest in zip(
            uuids, wins, kept.sum(axis=0).tolist(), newest.tolist(), live.sum(axis=0).tolist(), *cols, strict=True):
        if not n_kept:
            continue
        s = w[at]
        if not n_live:
            out[u] = GpuFeatures(u, s.node, 0, s.up, None, None, None, None, None)
            continue
        # Positional: GpuFeatures(uuid, node, samples, up, clock_ratio, power_ratio, utilization, temperature_c,
        # throttle_frac, throttle_reasons, throttled_newest); keywords cost ~0.4 µs more a GPU.
        out[u] = GpuFeatures(u, s.node, n_live, s.up, clock, power, util, temp, frac, _REASONS[reasons], hot_newest)
    return out


def _columns(x: np.ndarray, t: np.ndarray, live: np.ndarray, with_throttle: bool, with_energy: bool) -> list[list]:
    """Per GPU (column): clock ratio, power ratio, utilization, temperature (None where undefined), throttle
    fraction (None without throttle reasons), and the bit pattern of throttle reasons seen."""
    if with_throttle:
        hot = (x[..., THR] >= 0.5) & live[..., None]
        bits = (hot.any(axis=0) << np.arange(hot.shape[-1])).sum(axis=1).tolist()
        shows = hot.any(axis=2)
        frac = (shows.sum(axis=0) / np.maximum(live.sum(axis=0), 1)).tolist()
        newest = _throttled_newest(shows, t, live)
    else:
        bits, frac, newest = [0] * live.shape[1], [None] * live.shape[1], [None] * live.shape[1]
    with np.errstate(all="ignore"):  # a zero limit divides by zero; such samples are masked out
        # An idle GPU's clock drops: use only samples with kernels running, unless there are none.
        busy = live & (x[..., UTIL] >= 0.5)
        judged = np.where(busy.any(axis=0), busy, live)
        clock, k_clock = column_median(x[..., CLK] / x[..., CLK_MAX], judged & (x[..., CLK_MAX] > 0))
        power, k_power = column_median(x[..., POWER] / x[..., LIMIT], live & (x[..., LIMIT] > 0))
        if with_energy:
            mean_power, usable = _energy_ratio(x, t, live)
            power = np.where(usable, mean_power, power)
            k_power = np.where(usable, 1, k_power)  # defined wherever the counter gave it
    util, _ = column_median(x[..., UTIL], live)
    temp, _ = column_median(x[..., TEMP], live)
    return [_maybe(clock, k_clock), _maybe(power, k_power), util.tolist(), temp.tolist(), frac, bits, newest]


def _throttled_newest(shows: np.ndarray, t: np.ndarray, live: np.ndarray) -> list[float | None]:
    """Per GPU: its newest live sample's time when that sample and the live one before it both show a throttle
    reason, else None (GpuFeatures.throttled_newest)."""
    cols = np.arange(live.shape[1])
    last = last_row(live)
    before = last_row(live & (np.arange(live.shape[0])[:, None] != last[None, :]))
    both = (live.sum(axis=0) >= 2) & shows[last, cols] & shows[before, cols]
    return [float(v) if b else None for v, b in zip(t[last, cols].tolist(), both.tolist(), strict=True)]


def _energy_ratio(x: np.ndarray, t: np.ndarray, live: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean power from the energy counter over the window / the median limit, and where it is usable:
    ≥ 3 samples, time moved forward, the counter did not reset, a positive limit, and non-zero (the
    reference's `or` falls back to the sampled power on 0.0)."""
    limit, n_live = column_median(x[..., LIMIT], live)
    cols = np.arange(live.shape[1])
    first, last = first_row(live), last_row(live)
    t0, t1 = t[first, cols], t[last, cols]
    e0, e1 = x[first, cols, -1], x[last, cols, -1]
    with np.errstate(all="ignore"):  # unusable columns may divide by zero; they are masked out
        ratio = (e1 - e0) / (t1 - t0) / limit
    usable = (n_live >= 3) & (t1 > t0) & ~(e1 < e0) & (limit > 0)
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
