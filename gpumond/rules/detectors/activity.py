"""What GPM and NVLink telemetry add to a candidate's evidence: SM and tensor activity, and NVLink replays as a
named cause. Pure, and applied after the detectors: it explains a finding, it never makes or removes one.

A straggler or starved rank's GPU that shows high utilization but low SM activity is busy doing little; a node
whose GPUs replay on NVLink (the agent's GpuNvLinkErrorsIncreasing) slows every collective through them, which
is the straggler-node finding's likely cause. Values are present only where the agents export them (Hopper and
later for GPM); nothing is added otherwise.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from gpumond.rules.detectors.candidate import Candidate
from gpumond.rules.detectors.ragged import column_median, gather, has_nan, too_ragged
from gpumond.rules.detectors.stats import median
from gpumond.rules.types import GPU_SIGNALS, SAMPLE_ROWS, GpuColumns, GpuSample

# Replays per second over the window, on all links of a GPU, that name NVLink as a cause (the agent alerts on
# one link from the same rate).
NVLINK_REPLAY_PER_S = 1.0
NVLINK_CAUSE = "nvlink_errors"
_PER_GPU = frozenset({"straggler", "io_starved_rank", "hung_rank"})
_KEYS = ("sm_active", "tensor_active")
_KEY_ROWS = [3 + GPU_SIGNALS.index(k) for k in _KEYS]  # their GpuColumns rows
_KEY_BITS = np.array([1 << GPU_SIGNALS.index(k) for k in _KEYS], dtype=np.int64)  # their presence bits
_ANY_KEY = int(_KEY_BITS.sum())
_EMPTY = GpuColumns(np.empty((SAMPLE_ROWS, 0)))  # a GPU without telemetry: no samples


def _live(samples: Sequence[GpuSample], since: float) -> list[GpuSample]:
    return [s for s in samples if s.up and s.t >= since]


def activity(samples: Sequence[GpuSample], key: str) -> float | None:
    """The median of `key` (sm_active, tensor_active) over the samples that have it."""
    xs = [s.values[key] for s in samples if key in s.values]
    return median(xs) if xs else None


def replay_rate(samples: Sequence[GpuSample]) -> float | None:
    """NVLink replays per second from the first and last counter reading in the window (None: too few, or
    the counter went back, e.g. a reset)."""
    xs = [(s.t, s.values["nvlink_replays_total"]) for s in samples if "nvlink_replays_total" in s.values]
    if len(xs) < 2 or xs[-1][0] <= xs[0][0] or xs[-1][1] < xs[0][1]:
        return None
    return (xs[-1][1] - xs[0][1]) / (xs[-1][0] - xs[0][0])


def with_activity(c: Candidate, gpu_windows: Mapping[str, Sequence[GpuSample]], job_gpus: Mapping[str, str],
                  since: float) -> Candidate:
    """`c` with GPM activity and NVLink evidence added where telemetry has it; `job_gpus` is uuid → node of
    the job's reporting GPUs (the peers). One candidate of `with_activity_many`."""
    return with_activity_many([c], gpu_windows, job_gpus, since)[0]


def with_activity_many(candidates: Sequence[Candidate], gpu_windows: Mapping[str, Sequence[GpuSample]],
                       job_gpus: Mapping[str, str], since: float) -> list[Candidate]:
    """Each of a job's candidates as `with_activity` gives it. The job's live windows, its GPUs' activity
    and their sorted values are worked out once for all of them (not once per candidate: a job of
    thousands of GPUs with a few findings would read every GPU's window once per finding)."""
    job = _JobActivity(gpu_windows, job_gpus, since)
    return [_with(c, job) for c in candidates]


class _JobActivity:
    """One job's telemetry for one evaluation, each piece computed the first time a candidate needs it."""

    def __init__(self, gpu_windows: Mapping[str, Sequence[GpuSample]], job_gpus: Mapping[str, str],
                 since: float) -> None:
        self._gpu_windows, self.job_gpus, self._since = gpu_windows, job_gpus, since
        self._live: dict[str, list[GpuSample]] = {}
        self._windows: dict[str, Sequence[GpuSample]] = {}  # each GPU's window, read from the mapping once
        self._rates: dict[str, float | None] = {}
        self._values: dict[str, dict[str, float]] | None = None
        self._sorted: dict[str, list[float] | None] = {}

    def _window(self, uuid: str) -> Sequence[GpuSample]:
        if (w := self._windows.get(uuid)) is None:
            w = self._windows[uuid] = self._gpu_windows.get(uuid, ())
        return w

    def live(self, uuid: str) -> list[GpuSample]:
        if (w := self._live.get(uuid)) is None:
            w = self._live[uuid] = _live(self._window(uuid), self._since)
        return w

    def rate(self, uuid: str) -> float | None:
        if uuid not in self._rates:
            self._rates[uuid] = replay_rate(self.live(uuid))
        return self._rates[uuid]

    def values(self, key: str) -> dict[str, float]:
        """uuid → activity(live window, key) of the job's GPUs that have one, in `job_gpus` order."""
        if self._values is None:
            uuids = list(self.job_gpus)
            got, get = self._windows, self._gpu_windows.get
            wins = [got[u] if u in got else get(u, ()) for u in uuids]
            got.update(zip(uuids, wins))
            found = _from_columns(uuids, wins, self._since)
            self._values = found if found is not None else self._from_samples(uuids, wins)
        return self._values[key]

    def _from_samples(self, uuids: list[str], wins: list[Sequence[GpuSample]]) -> dict[str, dict[str, float]]:
        """values() read sample by sample: the reference, and the path of windows without columns."""
        # One pass over each window for its live samples and both keys (activity() per key reads the
        # window once each: at 8,320 GPUs the passes are most of this function's cost).
        out: dict[str, dict[str, float]] = {k: {} for k in _KEYS}
        sm, tensor = (out[k] for k in _KEYS)
        for u, window in zip(uuids, wins, strict=True):
            live, xs, ys = [], [], []
            read = self._live.get(u)  # a straggler node's GPUs may have been read already
            for s in read if read is not None else window:
                if s.up and s.t >= self._since:
                    live.append(s)
                    if (x := s.values.get(_KEYS[0])) is not None:
                        xs.append(x)
                    if (y := s.values.get(_KEYS[1])) is not None:
                        ys.append(y)
            self._live[u] = live
            if xs:
                sm[u] = median(xs)
            if ys:
                tensor[u] = median(ys)
        return out

    def peer_median(self, key: str, uuid: str) -> float | None:
        """The median of `key` over the job's GPUs other than `uuid` (None: no peer has it)."""
        values = self.values(key)
        if key not in self._sorted:
            xs = list(values.values())
            # NaN has no place in a sorted order: the median then depends on the order of the peers, so
            # such a job takes the peers list as it comes, each time (telemetry drops NaN; this is a guard).
            self._sorted[key] = None if any(math.isnan(x) for x in xs) else sorted(xs)
        s = self._sorted[key]
        if s is None:
            peers = [v for u, v in values.items() if u != uuid]
            return median(peers) if peers else None
        # Its own value left out of the sorted values (any equal one: the same peers), in O(log n).
        skip = bisect_left(s, values[uuid]) if uuid in values else len(s)
        n = len(s) - (skip < len(s))
        if n == 0:
            return None
        mid = n // 2
        if n % 2:
            return s[mid + (mid >= skip)]
        return 0.5 * (s[mid - 1 + (mid - 1 >= skip)] + s[mid + (mid >= skip)])


def _from_columns(uuids: list[str], wins: list[Sequence[GpuSample]],
                  since: float) -> dict[str, dict[str, float]] | None:
    """values() for every key from the windows' GpuColumns (concatenated once, index arithmetic, the medians of
    ragged.column_median), or None where the objects path must answer: a window without columns, a NaN activity
    value on a live sample, or windows so ragged that the padded matrix would be mostly padding.

    Why: read sample by sample, a 32,768-GPU job's windows cost ~0.5 s per evaluation that has a per-GPU
    candidate, nearly all of it spent finding that no sample carries GPM (the usual case before Hopper); the
    presence bits say so for the whole job in one numpy pass, with no per-GPU work after it."""
    cols = [getattr(w, "columns", None) if w else _EMPTY for w in wins]
    if None in cols:
        return None
    empty: dict[str, dict[str, float]] = {k: {} for k in _KEYS}
    # The presence row alone first: without GPM on any sample held (the usual case) that is all there is to
    # read, and it costs half of concatenating every row (~20 ms against ~50 at 32,768 GPUs × 13 samples).
    if not cols:
        return empty
    present = np.concatenate([c.data[2] for c in cols]).astype(np.int64)  # type: ignore[union-attr]
    if not (present & _ANY_KEY).any():
        return empty
    data = np.concatenate([c.data for c in cols], axis=1)  # type: ignore[union-attr]
    # NaN times are never live (`s.t >= since` is False for them), as in the objects path.
    live = (data[0] >= since) & (data[1] != 0.0)
    # (keys, samples): sample i carries key j, live. `key in s.values` is the presence bit, not a non-NaN value.
    has = ((present[None, :] & _KEY_BITS[:, None]) != 0) & live[None, :]
    if not has.any():
        return empty  # GPM only on samples that are down or older than since
    values = data[_KEY_ROWS]
    if has_nan(values[has]):
        return None
    counts = np.fromiter(map(len, cols), np.int64, len(cols))
    width = int(counts.max())
    if too_ragged(counts, width):
        return None
    # (2 keys + 2 masks, width, GPUs), oldest sample on top: the order column_median sorts ties in, as `sorted`.
    m = gather(np.concatenate([values, has]), np.cumsum(counts), counts, width, 0.0)
    out = {}
    for j, key in enumerate(_KEYS):
        med, k = column_median(m[j], m[len(_KEYS) + j] != 0.0)
        out[key] = {u: v for u, v, n in zip(uuids, med.tolist(), k.tolist(), strict=True) if n}
    return out


def _with(c: Candidate, job: _JobActivity) -> Candidate:
    evidence = dict(c.evidence)
    if c.kind in _PER_GPU and c.gpu_uuid in job.job_gpus:
        for key in _KEYS:
            value = job.values(key).get(c.gpu_uuid)
            if value is not None:
                evidence[key] = round(value, 3)
                if (peers := job.peer_median(key, c.gpu_uuid)) is not None:
                    evidence[f"peer_median_{key}"] = round(peers, 3)
        rate = job.rate(c.gpu_uuid)
        if rate is not None and rate >= NVLINK_REPLAY_PER_S:
            evidence["nvlink_replays_per_s"] = round(rate, 1)
            evidence.setdefault("likely_cause", NVLINK_CAUSE)
    elif c.kind == "straggler_node" and c.node is not None:
        rates = {u: r for u, node in job.job_gpus.items() if node == c.node
                 and (r := job.rate(u)) is not None and r >= NVLINK_REPLAY_PER_S}
        if rates:
            evidence["nvlink_replays_per_s"] = {u: round(r, 1) for u, r in sorted(rates.items())}
            evidence.setdefault("likely_cause", NVLINK_CAUSE)
    if evidence == c.evidence:
        return c
    return replace(c, evidence=evidence)
