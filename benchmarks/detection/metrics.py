"""Aggregate scored runs into the numbers the targets ask for: per class and level, latency, false alarms,
the confusion matrix, and each target's verdict."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from gpumond.rules.detectors.config import DetectorConfig

from benchmarks.detection.score import CLASSES, KIND_CLASS, RunResult, Truth

EPISODE_CLASS = {"slow_gpu": "straggler", "slow_node": "straggler_node", "starved_rank": "starved_rank",
                 "starved_node": "starved_rank", "starved_job": "starved_job", "hung_rank": "hung",
                 "starved_outlier": "starved_rank"}


@dataclass(frozen=True, slots=True)
class Row:
    """Recall / precision / F1 / latency of one bucket of faults."""

    label: str
    n: int
    detected: int
    tp: int  # true firing episodes of the bucket's class
    fp: int  # false firing episodes of that class in the bucket's scenarios
    lat: tuple[float, ...]

    @property
    def recall(self) -> float:
        return self.detected / self.n if self.n else float("nan")

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else float("nan")

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r > 0 else 0.0

    def p(self, q: float) -> float:
        return float(np.percentile(self.lat, q)) if self.lat else float("nan")


def _cls_of(r: RunResult) -> str | None:
    f = r.scenario.faults[0] if r.scenario.faults else None
    return EPISODE_CLASS.get(f.kind) if f else None


def row(label: str, results: Iterable[RunResult], pick=lambda tr: True, cls: str | None = None) -> Row:  # noqa: ANN001
    """One bucket: the truths `pick` selects; precision over episodes of `cls` (default: the truths' class)."""
    n = det = tp = fp = 0
    lat: list[float] = []
    for r in results:
        chosen = [tr for tr in r.truths if pick(tr)]
        if not chosen:
            continue
        n += len(chosen)
        det += sum(tr.detected for tr in chosen)
        lat += [tr.latency_s for tr in chosen if tr.latency_s is not None]
        c = cls or chosen[0].cls
        eps = [e for e in r.episodes if KIND_CLASS.get(e.kind) == c]
        tp += sum(e.label == "tp" for e in eps)
        fp += sum(e.label == "fp" for e in eps)
    return Row(label, n, det, tp, fp, tuple(lat))


def class_totals(results: Sequence[RunResult]) -> dict[str, Row]:
    """Per finding class over every scenario: recall over its faults, precision over all its episodes."""
    out = {}
    for c in CLASSES:
        n = det = tp = fp = 0
        lat: list[float] = []
        for r in results:
            trs = [tr for tr in r.truths if tr.cls == c]
            n += len(trs)
            det += sum(tr.detected for tr in trs)
            lat += [tr.latency_s for tr in trs if tr.latency_s is not None]
            for e in r.episodes:
                if KIND_CLASS.get(e.kind) == c:
                    tp += e.label == "tp"
                    fp += e.label == "fp"
        out[c] = Row(c, n, det, tp, fp, tuple(lat))
    return out


def mixed(results: Sequence[RunResult], exclude=lambda tr: False) -> Row:  # noqa: ANN001
    """Every localisation class pooled: recall over faults, precision over every firing episode."""
    n = det = tp = fp = 0
    for r in results:
        trs = [tr for tr in r.truths if tr.cls != "none" and not exclude(tr)]
        n += len(trs)
        det += sum(tr.detected for tr in trs)
        for e in r.episodes:
            if e.kind in KIND_CLASS:
                tp += e.label == "tp"
                fp += e.label == "fp"
    return Row("mixed", n, det, tp, fp, ())


def confusion(results: Sequence[RunResult]) -> dict[str, dict[str, int]]:
    """Rows: truth class (and `none` for false episodes in fault-free runs); columns: what was reported."""
    m: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in results:
        for tr in r.truths:
            if tr.cls != "none":
                m[tr.cls][tr.predicted] += 1
        if r.scenario.kind == "control":
            for e in r.episodes:
                if e.kind in KIND_CLASS and e.label == "fp":
                    m["none"][KIND_CLASS[e.kind]] += 1
    return {k: dict(v) for k, v in m.items()}


def told_apart(results: Sequence[RunResult], job_line: float = DetectorConfig().job_min_cost_frac) -> tuple[int, int]:
    """(faults told apart, faults): a starved rank/node without an io_starved_job, a starved job with
    io_starved_job and no io_starved_rank. A starved job whose wait is under `job_line` (the job finding's cost
    line, job_min_cost_frac: a loader at ~5 % is not worth a page) is told apart when no rank is
    named: quiet is what the service promises for it, and naming one of its ranks is the confusion this counts."""
    ok = n = 0
    for r in results:
        seen_faults = set()
        for tr in r.truths:
            f = tr.fault
            if f.kind in ("starved_rank", "starved_node"):
                if id(f) in seen_faults:
                    continue
                seen_faults.add(id(f))
                n += 1
                ok += not tr.job_finding
            elif f.kind == "starved_job":
                n += 1
                ok += (tr.job_finding or f.wait_frac < job_line) and not tr.rank_finding
    return ok, n


def false_alarms(results: Sequence[RunResult]) -> list[dict]:
    """Per fault-free scenario name: node-hours, job-hours, false episodes by kind."""
    by: dict[str, dict] = {}
    for r in results:
        if r.scenario.kind != "control":
            continue
        name = r.scenario.tags["control"]
        d = by.setdefault(name, {"control": name, "runs": 0, "nodes": r.scenario.nodes, "node_hours": 0.0,
                                 "job_hours": 0.0, "false": defaultdict(int)})
        d["runs"] += 1
        d["node_hours"] += r.node_hours
        d["job_hours"] += r.scenario.duration_s / 3600.0 * len(r.scenario.jobs)
        for e in r.episodes:
            if e.label == "fp":
                d["false"][e.kind] += 1
    return list(by.values())


def cause_accuracy(results: Sequence[RunResult]) -> tuple[int, int]:
    """(right, detected) likely_cause of detected starved ranks whose cause shows on the host."""
    ok = n = 0
    for r in results:
        for tr in r.truths:
            if tr.cls == "starved_rank" and tr.detected and tr.fault.cause in ("cpu", "storage"):
                n += 1
                ok += tr.cause == tr.fault.cause
    return ok, n


def truths(results: Sequence[RunResult]) -> list[Truth]:
    """Every truth of every run."""
    return [tr for r in results for tr in r.truths]


def latency_parts(results: Sequence[RunResult], pick) -> list[dict]:  # noqa: ANN001
    """Where the latency of the truths `pick` selects goes, per (fault kind, throttled or silent, step time): the
    detector's share (onset to the first evaluation that flagged the entity: its first `pending`), what the
    persistence added (from there to `firing`), and how many fired at once (on sequential or corroborated
    evidence, flagged and firing at the same evaluation)."""
    by: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for r in results:
        for i, tr in enumerate(r.truths):
            if not pick(tr) or not tr.detected:
                continue
            ep = min((e for e in r.episodes if e.fault == i and e.label == "tp"), key=lambda e: e.fired)
            f = tr.fault
            key = (f.kind, "throttled" if f.visible else "silent", r.scenario.tags.get("step_s"))
            by[key].append((ep.since - f.onset, ep.fired - ep.since))
    out = []
    for (kind, vis, step), xs in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0)):
        flagged, added = np.array(xs).T
        out.append({"kind": kind, "visible": vis, "step_s": step, "n": len(xs),
                    "flagged_p50": float(np.median(flagged)), "added_p50": float(np.median(added)),
                    "at_once": int((added < 0.5).sum()), "total_p50": float(np.median(flagged + added))})
    return out
