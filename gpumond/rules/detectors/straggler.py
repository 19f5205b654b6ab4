"""Straggler localisation by robust peer comparison on signals that do not equalise across ranks.

Step time cannot localise a straggler in synchronous training (every rank waits for the slowest), so we
compare each GPU with its peers in the same job and group on SM clock, throttle reasons, power and
temperature. A GPU slowed visibly (thermal, power brake) shows a low clock and throttle reasons; a
silently slow GPU computes through the time its peers spin in the collective, so its power sits apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpumond.rules.detectors.candidate import Candidate
from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.features import GpuFeatures, RankFeatures
from gpumond.rules.detectors.stats import median, robust_z, threshold_for


def _signal(xs: list[tuple[RankFeatures, float]], floor: float, thr: float,
            sign: int) -> dict[int, tuple[float, float, float]]:
    """rank → (z, value, peer median) for ranks past the threshold in the bad direction (sign=0: either)."""
    if len(xs) < 2:
        return {}
    zs, med, _ = robust_z([v for _, v in xs], floor)
    out = {}
    for (r, v), z in zip(xs, zs, strict=True):
        bad = abs(z) if sign == 0 else sign * z
        if bad > thr:
            out[r.rank] = (z, v, med)
    return out


def detect_stragglers(job: str, ranks: Sequence[RankFeatures], gpus: Mapping[str, GpuFeatures],
                      cfg: DetectorConfig) -> list[Candidate]:
    """Straggling GPUs (one candidate each) and straggling nodes (their GPUs deviate together)."""
    groups: dict[str | None, list[tuple[RankFeatures, GpuFeatures]]] = {}
    for r in ranks:
        g = gpus.get(r.gpu_uuid)
        if g is not None and g.up and g.samples >= cfg.min_samples:  # a fresh job: not enough to judge
            groups.setdefault(r.group, []).append((r, g))
    out: list[Candidate] = []
    for group, members in groups.items():
        if len(members) < cfg.min_peers:
            continue
        thr = threshold_for(len(members), cfg.z_base, cfg.z_tail)
        flagged: dict[int, dict[str, object]] = {}
        scores: dict[int, float] = {}

        def note(rank: int, signal: str, z: float, value: float, med: float) -> None:
            flagged.setdefault(rank, {})[signal] = {"value": round(value, 4), "peer_median": round(med, 4),
                                                    "z": round(z, 2)}
            scores[rank] = max(scores.get(rank, 0.0), abs(z))

        for name, attr, floor, sign in (
            ("sm_clock_ratio", "clock_ratio", cfg.floor_clock_ratio, -1),
            ("power_ratio", "power_ratio", cfg.floor_power_ratio, 0),
            ("temperature_c", "temperature_c", cfg.floor_temperature_c, +1),
        ):
            xs = [(r, getattr(g, attr)) for r, g in members if getattr(g, attr) is not None]
            for rank, (z, v, med) in _signal(xs, floor, thr, sign).items():
                note(rank, name, z, v, med)
        # Throttle reasons are near-binary: a robust z is meaningless when peers are all 0.
        tf = [(r, g.throttle_frac) for r, g in members if g.throttle_frac is not None]
        if len(tf) >= cfg.min_peers:
            peer_med = median([v for _, v in tf])
            if peer_med <= cfg.throttle_peer_max:
                for r, v in tf:
                    if v >= cfg.throttle_frac_min:
                        note(r.rank, "throttled", thr + 1.0, v, peer_med)
        # Temperature alone is weak evidence (cooling differs by slot); it only supports another signal.
        for rank in [k for k, sig in flagged.items() if set(sig) == {"temperature_c"}]:
            del flagged[rank], scores[rank]
        # A shift, not stragglers: many ranks on many nodes sit past half the threshold on clock or power
        # (a heavier pipeline stage the job did not label). Counting only the flagged ones misses a shift
        # whose members straddle the threshold from one evaluation to the next.
        soft: dict[int, str] = {}
        for attr, floor, sign in (("clock_ratio", cfg.floor_clock_ratio, -1), ("power_ratio", cfg.floor_power_ratio, 0)):
            xs = [(r, getattr(g, attr)) for r, g in members if getattr(g, attr) is not None]
            if len(xs) < 2:
                continue
            zs, _, _ = robust_z([v for _, v in xs], floor)
            for (r, _), z in zip(xs, zs, strict=True):
                if (abs(z) if sign == 0 else sign * z) > thr / 2:
                    soft[r.rank] = r.node
        nodes_in_group = len({r.node for r, _ in members})
        if len(soft) > max(1, cfg.max_outlier_frac * len(members)) \
                and len(set(soft.values())) > max(1, cfg.max_outlier_frac * nodes_in_group):
            # keep only what a shift cannot explain: a throttle reason on the GPU itself
            flagged = {k: v for k, v in flagged.items() if "throttled" in v}
            scores = {k: scores[k] for k in flagged}
        by_rank = {r.rank: (r, g) for r, g in members}
        for rank, evidence in flagged.items():
            r, g = by_rank[rank]
            reasons = {"throttle_reasons": list(g.throttle_reasons)} if g.throttle_reasons else {}
            out.append(Candidate("straggler", job, r.node, rank, r.gpu_uuid, round(scores[rank], 2),
                                 {"group": group, "peers": len(members), "threshold_z": round(thr, 2),
                                  "signals": evidence, **reasons}))
        out.extend(_nodes(job, group, members, flagged, scores, cfg))
    return out


def _nodes(job: str, group: str | None, members: list[tuple[RankFeatures, GpuFeatures]],
           flagged: Mapping[int, object], scores: Mapping[int, float], cfg: DetectorConfig) -> list[Candidate]:
    per_node: dict[str, list[RankFeatures]] = {}
    for r, _ in members:
        per_node.setdefault(r.node, []).append(r)
    nodes_in_job = len(per_node)
    out = []
    for node, rs in per_node.items():
        bad = [r for r in rs if r.rank in flagged]
        if nodes_in_job >= 2 and len(bad) >= cfg.node_min_gpus and 2 * len(bad) >= len(rs):
            out.append(Candidate("straggler_node", job, node, None, None,
                                 round(max(scores[r.rank] for r in bad), 2),
                                 {"group": group, "gpus_flagged": len(bad), "gpus_on_node": len(rs),
                                  "ranks": sorted(r.rank for r in bad)}))
    return out
