"""Findings are alerts: a detector's candidate becomes an alert condition, and the one alert lifecycle
(gpumond.alerts.lifecycle) decides pending → firing (k of n evaluations over at least `findings.min_duration_s`
of wall time, or at once when corroborated) → resolved (after `clear` quiet evaluations spanning
`findings.resolve_after_s`). This module only translates between the two vocabularies."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence

from gpumond.alerts.catalogue import ALERTS, KIND_TO_ALERT, alert_for_kind
from gpumond.alerts.lifecycle import AlertTracker, Entry, Persistence
from gpumond.alerts.model import Condition
from gpumond.rules.detectors.candidate import Candidate
from gpumond.rules.types import Finding

__all__ = ["FINDINGS_PERSISTENCE", "Persistence", "advance", "conditions_of", "finding_condition", "finding_of",
           "findings_of", "findings_persistence"]


def findings_persistence(min_duration_s: float = 20.0, resolve_after_s: float = 30.0) -> Persistence:
    """Two of the last three evaluations flag an entity, first flagged at least `min_duration_s` ago, before
    it fires; three quiet evaluations spanning `resolve_after_s` resolve it. The durations are what keep a
    transient (a rank slowed for a few steps) from firing when evaluations are seconds apart.

    20 s at the 5 s default interval: what 10 s gave at 10 s. There a flag had to be seen at two evaluations
    10 s apart, so an excursion of a median look lasting L (10 < L < 20 s) fired with chance (L − 10) / 10;
    sampled every 5 s each one over ~10 s fires (an uneven-sequence control's 15 s excursion did). Findings on
    sequential evidence (their own minimum duration) and corroborated ones fire at once, whatever this is.

    A look lasts half the minimum duration (`look_s`; 10 s at the defaults, the cadence the windowed checks
    were validated at): evaluations closer together are one look, a sighting only if every evaluation in it
    flagged the entity. Without it a median hovering at its threshold (seen, not seen, seen, … every 5 s)
    added up to 2 of 3 over 20 s, where one look sees it at most as often as one evaluation does (a 60 s
    median compute share at z 4.6 against 4.5 fired in a fault-free control at 5 s, not at 10 s). A finding
    that holds is flagged at every evaluation and fires `min_duration_s` after it was first flagged, as
    before; half, so that the k = 2 looks still fit in that time when an operator shortens it."""
    return Persistence(k=2, n=3, clear=3, min_s=min_duration_s, clear_s=resolve_after_s, look_s=min_duration_s / 2)


# The defaults of `findings:` in the rules config (gpumond.config.rules.FindingsConfig).
FINDINGS_PERSISTENCE = findings_persistence()
_ALERT_TO_KIND = {alert: kind for kind, alert in KIND_TO_ALERT.items()}
# Evidence fields worth a sentence, in the order a person reads them.
_HEADLINE = ("likely_cause", "data_wait_frac", "median_data_wait_frac", "slowdown", "stalled_for_s", "gpus_flagged",
             "compute_share", "peer_median_compute_share")


def describe_entity(c: Candidate, gpu_index: str | None) -> str:
    """`rank 11 (demo-node-01 GPU 3) of job J`, `node N in job J` or `job J`: how a person finds the entity."""
    place = c.node or ""
    if gpu_index is not None:
        place = f"{place} GPU {gpu_index}".strip()
    if c.rank is not None:
        return f"rank {c.rank}" + (f" ({place})" if place else "") + f" of job {c.job}"
    if c.node:
        return f"node {c.node} in job {c.job}"
    return f"job {c.job}"


def _headline(evidence: dict[str, object]) -> str:
    parts = [f"{k} {evidence[k]}" for k in _HEADLINE if k in evidence and not isinstance(evidence[k], dict)]
    return "; ".join(parts)


def finding_condition(c: Candidate, gpu_index: str | None = None) -> Condition:
    """The alert condition of one candidate: identity in labels, evidence in annotations."""
    alertname = alert_for_kind(c.kind)
    spec = ALERTS[alertname]
    evidence = dict(c.evidence)
    labels = {"alertname": alertname, "severity": spec.severity, "job": c.job, "node": c.node,
              "rank": c.rank, "uuid": c.gpu_uuid}
    # The GPU index is in the summary, not the labels: it comes from telemetry, which may arrive after the
    # first evaluation, and a label that changes would make a second alert (and a second page).
    headline = _headline(evidence)
    annotations = {
        "summary": f"{describe_entity(c, gpu_index)}: {spec.summary}",
        "description": f"{spec.meaning}" + (f" Evidence: {headline}." if headline else ""),
        "evidence": json.dumps(evidence, separators=(",", ":"), default=str, sort_keys=True),
        "score": f"{c.score:g}",
    }
    return Condition.of(labels, annotations, immediate=c.corroborated or c.sustained, payload=c)


def finding_of(entry: Entry) -> Finding | None:
    """The finding an alert entry stands for (None for alerts that are not findings, e.g. the Watchdog)."""
    a = entry.alert
    if a.state == "resolved":
        return None
    c = entry.payload
    if isinstance(c, Candidate):
        return Finding(kind=c.kind, job=c.job, node=c.node, rank=c.rank, gpu_uuid=c.gpu_uuid, score=c.score,
                       since=entry.active_since, state=a.state, evidence=dict(c.evidence))
    kind = _ALERT_TO_KIND.get(a.alertname)
    if kind is None:
        return None
    # Restored from the state file after a restart: identity from the labels, the last evidence as recorded.
    try:
        evidence = json.loads(a.annotation("evidence") or "{}")
    except ValueError:
        evidence = {}
    rank = a.label("rank")
    return Finding(kind=kind, job=a.label("job") or "", node=a.label("node"), rank=int(rank) if rank else None,
                   gpu_uuid=a.label("uuid"), score=float(a.annotation("score") or 0.0), since=entry.active_since,
                   state=a.state, evidence={"restored": True, **evidence})


def findings_of(entries: Iterable[Entry]) -> list[Finding]:
    """Pending and firing findings, highest score first."""
    found = [f for e in entries if (f := finding_of(e)) is not None]
    return sorted(found, key=lambda f: (-f.score, f.kind, f.job))


def conditions_of(candidates: Iterable[Candidate], gpu_index: Callable[[str], str | None]) -> list[Condition]:
    """One condition per entity (a detector that names one twice keeps its highest score)."""
    best: dict[str, Condition] = {}
    for c in candidates:
        cond = finding_condition(c, gpu_index(c.gpu_uuid) if c.gpu_uuid else None)
        old = best.get(cond.fingerprint)
        if old is None or c.score > old.payload.score:  # type: ignore[union-attr]
            best[cond.fingerprint] = cond
    return list(best.values())


def advance(tracker: AlertTracker | None, candidates: Sequence[Candidate], now: float,
            p: Persistence = FINDINGS_PERSISTENCE,
            gpu_index: Callable[[str], str | None] = lambda uuid: None,
            ) -> tuple[AlertTracker, list[Finding], list[Finding]]:
    """Fold one evaluation's candidates into the lifecycle (a fresh one when `tracker` is None);
    returns (tracker, current findings, findings resolved now). For offline use (benchmarks, tests); the
    service runs the same lifecycle inside its AlertPipeline."""
    tracker = tracker if tracker is not None else AlertTracker(persistence=p)
    tracker, transitions = tracker.update(conditions_of(candidates, gpu_index), now)
    resolved = [Finding(kind=_ALERT_TO_KIND[t.alert.alertname], job=t.alert.label("job") or "",
                        node=t.alert.label("node"), rank=int(r) if (r := t.alert.label("rank")) else None,
                        gpu_uuid=t.alert.label("uuid"), score=float(t.alert.annotation("score") or 0.0),
                        since=t.alert.starts_at, state="firing")
                for t in transitions if t.new == "resolved" and t.alert.alertname in _ALERT_TO_KIND]
    return tracker, findings_of(tracker.entries), resolved
