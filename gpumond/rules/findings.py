"""Findings lifecycle: a candidate becomes pending, fires after persistence (k of n evaluations), and
resolves after staying clear for a while. Pure: state in, state out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gpumond.rules.detectors.candidate import Candidate
from gpumond.rules.types import Finding

Key = tuple[str, str, str | None, int | None, str | None]


@dataclass(frozen=True, slots=True)
class Persistence:
    """k of the last n evaluations must flag an entity before it fires (one, if the candidate is
    corroborated by independent evidence); `clear` quiet ones resolve it."""

    k: int = 2
    n: int = 3
    clear: int = 3


@dataclass(frozen=True, slots=True)
class Track:
    """One entity's recent history."""

    candidate: Candidate
    since: float
    hits: tuple[bool, ...]
    firing: bool = False
    quiet: int = 0


def advance(tracks: Mapping[Key, Track], candidates: Sequence[Candidate], now: float,
            p: Persistence = Persistence()) -> tuple[dict[Key, Track], list[Finding], list[Finding]]:
    """Fold one evaluation's candidates in; returns (tracks, current findings, findings resolved now)."""
    seen = {c.key: c for c in candidates}
    new: dict[Key, Track] = {}
    resolved: list[Finding] = []
    for key, t in tracks.items():
        c = seen.pop(key, None)
        hits = (t.hits + (c is not None,))[-p.n:]
        if c is not None:
            t = replace(t, candidate=c, hits=hits, quiet=0)
        else:
            t = replace(t, hits=hits, quiet=t.quiet + 1)
        if not t.firing and (sum(hits) >= p.k or (c is not None and c.corroborated)):
            t = replace(t, firing=True)
        if t.firing and t.quiet >= p.clear:
            resolved.append(_finding(t))
            continue
        if not t.firing and not any(hits):
            continue  # a pending entity that went quiet for n evaluations is dropped silently
        new[key] = t
    for key, c in seen.items():
        t = Track(c, now, (True,))
        new[key] = replace(t, firing=p.k <= 1 or c.corroborated)
    findings = sorted((_finding(t) for t in new.values()), key=lambda f: (-f.score, f.kind, f.job))
    return new, findings, resolved


def _finding(t: Track) -> Finding:
    c = t.candidate
    return Finding(kind=c.kind, job=c.job, node=c.node, rank=c.rank, gpu_uuid=c.gpu_uuid, score=c.score,
                   since=t.since, state="firing" if t.firing else "pending", evidence=dict(c.evidence))
