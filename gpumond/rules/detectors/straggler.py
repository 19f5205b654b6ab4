"""Straggler localisation by robust peer comparison on signals that do not equalise across ranks.

Step time cannot localise a straggler in synchronous training (every rank waits for the slowest), so we
compare each GPU with its peers in the same job and group on SM clock, throttle reasons, power and
temperature, and each rank's compute share (from the collective wait the job pushes). A GPU slowed
visibly (thermal, power brake) shows a low clock and throttle reasons; a silently slow GPU computes
through the time its peers spin in the collective, so its compute share (and, less reliably, its power)
sits apart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpumond.rules.detectors.candidate import Candidate
from gpumond.rules.detectors.compute_share import LOOKS, Shares
from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.features import GpuFeatures, RankFeatures
from gpumond.rules.detectors.sequential import StepShares, corroborated_compute_test, judge
from gpumond.rules.detectors.stats import MAD_TO_SIGMA, median, robust_z, threshold_for


Series = list[tuple[RankFeatures, float]]


def _scored(xs: Series, floor: float) -> tuple[list[float], float]:
    """(robust z of each value, the peer median); empty for fewer than two values."""
    if len(xs) < 2:
        return [], 0.0
    zs, med, _ = robust_z([v for _, v in xs], floor)
    return zs, med


def _past(xs: Series, scored: tuple[list[float], float], thr: float,
          sign: int) -> dict[int, tuple[float, float, float]]:
    """rank → (z, value, peer median) for ranks past the threshold in the bad direction (sign=0: either)."""
    zs, med = scored
    return {xs[i][0].rank: (zs[i], xs[i][1], med) for i in _past_index(zs, thr, sign)}


@dataclass(frozen=True, slots=True)
class StragglerResult:
    """This evaluation's straggler candidates, and the nodes whose GPUs deviated together on silent signals
    (the engine learns a job's workload structure from these; see `engine.evaluate`)."""

    candidates: list[Candidate]
    blocks: frozenset[str]
    judged: bool  # some group had enough comparable peers
    # The blocks on what the GPUs do now (the short look, else power), without the minute or more of history
    # the other looks span: a node slowed for a while at the job's start stops deviating here first.
    current: frozenset[str] = frozenset()


Member = tuple[RankFeatures, GpuFeatures | None, Shares | None]
# What the peer looks found, each group's, by the nodes split off (detect_stragglers' `looks`).
LooksKept = dict[frozenset[str], list["Looks"]]
# Signals from the GPU's agent that show a cause on the GPU itself. Power is not one of them: a rank with
# heavier batches computes longer *and* draws more, so power and compute share agree on workload too.
_GPU_CAUSE = frozenset({"sm_clock_ratio", "throttled"})


def detect_stragglers(job: str, ranks: Sequence[RankFeatures], gpus: Mapping[str, GpuFeatures],
                      cfg: DetectorConfig, shares: Mapping[int, Shares] | None = None,
                      structural: frozenset[str] = frozenset(), learning: bool = False,
                      steps: StepShares | None = None, activity: Mapping[str, float] | None = None,
                      looks: LooksKept | None = None) -> StragglerResult:
    """Straggling GPUs (one candidate each) and straggling nodes (their GPUs deviate together).

    `shares` are the ranks' compute shares (jobs whose SDK pushes comm waits). `structural` are nodes whose
    GPUs deviated together since the job could first be judged — workload structure, such as a heavier
    pipeline stage the job did not label — so they form a peer group of their own, as if the job had
    labelled it. While `learning` that structure, the nodes deviating together in this evaluation are
    split off the same way (and reported in `blocks`, measured before the split, for the engine to count).
    `steps` are the job's per-step compute shares, for sequential evidence (sequential.py). `activity` is
    each GPU's SM activity relative to its node's (sm_activity.py), judged for ranks without a compute share.

    `looks`: what the peer looks found in each group (`Looks`), kept between calls with the same ranks, GPUs,
    shares and activity (the caller's to key: engine.Windowed keeps one per job picture and starved set), by the
    nodes split off; those found before are taken, the others found and kept. Only the sequential tests then
    read the steps: a judgement on arrival judges its new steps against the looks of the picture it shares with
    the periodic judgement before it, instead of finding them again for every rank. None: found afresh.
    """
    shares = shares or {}
    members: list[Member] | None = None

    def looks_of(split: frozenset[str]) -> list[Looks]:
        nonlocal members
        if looks is not None and split in looks:
            return looks[split]
        if members is None:
            members = _members(ranks, gpus, shares, cfg)
        found = _looks_of(members, cfg, split, activity)
        if looks is not None:
            looks[split] = found
        return found

    blocks: set[str] = set()
    current: set[str] = set()
    whole = None
    if learning:  # counted on the job as a whole: split by what was learnt so far, a block would vanish
        whole = _judge(job, looks_of(frozenset()), cfg, steps)
        _, blocks, current, _ = whole
    split = structural | blocks
    if whole is not None and not split:
        out, after, after_current, judged = whole  # nothing to split off: the same groups, judged already
    else:
        out, after, after_current, judged = _judge(job, looks_of(frozenset(split)), cfg, steps)
    if not learning:
        blocks, current = after, after_current
    return StragglerResult(out, frozenset(blocks), judged, frozenset(current))


def _members(ranks: Sequence[RankFeatures], gpus: Mapping[str, GpuFeatures], shares: Mapping[int, Shares],
             cfg: DetectorConfig) -> list[Member]:
    """The ranks that can be compared: with a GPU measured long enough, or a compute share, or both."""
    members: list[Member] = []
    for r in ranks:
        g = gpus.get(r.gpu_uuid)
        if g is None or not g.up or g.samples < cfg.min_samples:  # a fresh job: not enough to judge
            g = None
        sh = shares.get(r.rank)
        if g is not None or sh is not None:
            members.append((r, g, sh))
    return members


def _looks_of(members_of: list[Member], cfg: DetectorConfig, split: frozenset[str],
              activity: Mapping[str, float] | None) -> list[Looks]:
    """The peer looks of each group with enough peers (the job's own groups, with `split` nodes apart)."""
    groups: dict[tuple[tuple[str | None, str | None], bool], list[Member]] = {}
    for m in members_of:
        groups.setdefault((m[0].peers, m[0].node in split), []).append(m)
    return [_looks(group, members, cfg, activity) for ((group, _profile), _), members in groups.items()
            if len(members) >= cfg.min_peers]


def _judge(job: str, groups: list[Looks], cfg: DetectorConfig,
           steps: StepShares | None = None) -> tuple[list[Candidate], set[str], set[str], bool]:
    """Each group's candidates: its looks, and its sequential tests on `steps`."""
    out: list[Candidate] = []
    blocks: set[str] = set()
    current: set[str] = set()
    for looks in groups:
        out.extend(_group(job, looks, cfg, steps))
        blocks |= looks.blocks
        current |= looks.current
    return out, blocks, current, bool(groups)


@dataclass(frozen=True, slots=True)
class Looks:
    """What one peer group's looks found, on its ranks' features, GPUs and shares alone (no step is read): the
    ranks flagged and why, and what the group's candidates and its sequential tests need of its members."""

    group: str | None
    peers: int  # the group's members
    thr: float
    # rank → signal → evidence, before the sequential tests (each judgement copies them before adding to them)
    flagged: Mapping[int, Mapping[str, object]]
    scores: Mapping[int, float]
    share_ranks: tuple[int, ...]  # the ranks with a compute share, in the members' order
    throttled_now: Mapping[int, tuple[float, tuple[str, ...]]]  # _throttled_now of every member
    shift: bool
    blocks: frozenset[str]
    current: frozenset[str]
    per_node: Mapping[str, list[RankFeatures]]
    by_rank: Mapping[int, tuple[RankFeatures, GpuFeatures | None]]


def _looks(group: str | None, members: list[Member], cfg: DetectorConfig,
           activity: Mapping[str, float] | None = None) -> Looks:
    """A group's peer looks: each signal's robust z against the group (clock, power, temperature, the compute
    share's short, recent and long looks, SM activity, throttle reasons), the ranks past the threshold, and
    whether the group shifted together (a heavier stage, not stragglers)."""
    thr = threshold_for(len(members), cfg.z_base, cfg.z_tail)
    flagged: dict[int, dict[str, object]] = {}
    scores: dict[int, float] = {}

    def note(rank: int, signal: str, z: float, value: float, med: float, **extra: object) -> None:
        flagged.setdefault(rank, {})[signal] = {"value": round(value, 4), "peer_median": round(med, 4),
                                                "z": round(z, 2), **extra}
        scores[rank] = max(scores.get(rank, 0.0), abs(z))

    # A rank waiting on its data loader idles its GPU: low power and clock are explained by the wait, so
    # it is neither judged nor a peer on those (its compute share already has the wait taken out).
    busy = [(r, g) for r, g, _ in members
            if g is not None and (r.wait_mean is None or r.wait_mean < cfg.wait_min_frac)]
    with_sh = [(r, sh) for r, _, sh in members if sh is not None]
    series: dict[str, tuple[Series, float, int]] = {}  # signal → (values, MAD floor, bad direction)
    for name, attr, floor, sign in (
        ("sm_clock_ratio", "clock_ratio", cfg.floor_clock_ratio, -1),
        ("power_ratio", "power_ratio", cfg.floor_power_ratio, 0),
        ("temperature_c", "temperature_c", cfg.floor_temperature_c, +1),
    ):
        series[name] = ([(r, v) for r, g in busy if (v := getattr(g, attr)) is not None], floor, sign)
    noise = noise_floors([r for r, _ in with_sh])
    for look in LOOKS:
        floor = cfg.floor_compute_share_long if look == "long" else max(cfg.floor_compute_share, noise[look])
        series[look] = ([(r, v) for r, sh in with_sh if (v := getattr(sh, look)) is not None], floor, +1)
    scored = {name: _scored(xs, floor) for name, (xs, floor, _) in series.items()}

    for name in ("sm_clock_ratio", "power_ratio", "temperature_c"):
        xs, _, sign = series[name]
        for rank, (z, v, med) in _past(xs, scored[name], thr, sign).items():
            note(rank, name, z, v, med)
    # The slow rank computes through the time its peers wait for it: its compute share sits above theirs.
    # The strongest look is reported. A median over few steps (the short look always; the recent one when
    # steps are long) must clear the threshold by one more: a median of a few heavy-tailed step times has
    # heavier tails than the Gaussian the threshold assumes, and consecutive evaluations share most of
    # those steps, so persistence adds little. So must the long look, a median over the few (about six)
    # independent windows of its five minutes: its excursions last minutes, so persistence adds nothing, and
    # a group's healthy ranks crossed the bare threshold in 1–5 % of half-hour runs on Gaussian steps alone
    # (docs/detectors.md, "Peer comparison").
    steps = {r.rank: r.steps for r, _, _ in members}
    for look in LOOKS:
        for rank, (z, v, med) in _past(series[look][0], scored[look], thr, +1).items():
            few = look in ("short", "long") or (look == "recent" and steps[rank] < cfg.share_few_steps)
            if few and z <= thr + cfg.few_steps_extra_z:
                continue
            prev = flagged.get(rank, {}).get("compute_share")
            if prev is None or abs(z) > abs(prev["z"]):  # type: ignore[index]
                note(rank, "compute_share", z, v, med, look=look)
    # Throttle reasons are near-binary: a robust z is meaningless when peers are all 0.
    tf = [(r, v) for r, g, _ in members if g is not None and (v := g.throttle_frac) is not None]
    if len(tf) >= cfg.min_peers:
        peer_med = median([v for _, v in tf])
        if peer_med <= cfg.throttle_peer_max:
            for r, v in tf:
                if v >= cfg.throttle_frac_min:
                    note(r.rank, "throttled", thr + 1.0, v, peer_med)
    # Temperature alone is weak evidence (cooling differs by slot); it only supports another signal. So is
    # power for a rank with a compute share: the share measures the same thing (how long the GPU computes)
    # directly, while the energy mean also moves with workload noise (a few batches of long sequences).
    with_share = {r.rank for r, sh in with_sh if (sh.short, sh.recent, sh.long) != (None, None, None)}
    for rank in [k for k, sig in flagged.items()
                 if set(sig) <= ({"temperature_c", "power_ratio"} if k in with_share else {"temperature_c"})]:
        del flagged[rank], scores[rank]
    _sm_active(members, activity or {}, thr, cfg, note)
    per_node: dict[str, list[RankFeatures]] = {}
    for r, _, _ in members:
        per_node.setdefault(r.node, []).append(r)
    # A shift, not stragglers: many ranks on many nodes sit past half the threshold on one silent signal
    # (a heavier pipeline stage the job did not label). Counting only the flagged ones misses a shift
    # whose members straddle the threshold from one evaluation to the next; counting per signal keeps
    # noise spread over several signals and looks from adding up to a shift.
    soft: dict[int, str] = {}
    soft_now: set[int] = set()  # the same without the long look
    shift = False
    # The short look is for latency and noisy by design; a shift shows just as well in the steadier ones.
    for name in ("sm_clock_ratio", "power_ratio", "recent", "long"):
        xs, _, sign = series[name]
        past = {r.rank: r.node for r, _ in (xs[i] for i in _past_index(scored[name][0], thr / 2, sign))}
        if name != "sm_clock_ratio":  # workload structure shows in how long a GPU computes; a low clock is the GPU's own doing
            soft.update(past)
    # What a node's GPUs do now: the short look (the last steps) where the rank has one, else power. Both
    # other looks span a minute or more, so a node slowed for a while keeps deviating on them long after.
    with_short = {r.rank for r, _ in series["short"][0]}
    for name in ("short", "power_ratio"):
        xs, _, sign = series[name]
        soft_now.update(r.rank for r, _ in (xs[i] for i in _past_index(scored[name][0], thr / 2, sign))
                        if name == "short" or r.rank not in with_short)
        shift = shift or (len(past) > max(1, cfg.max_outlier_frac * len(members))
                          and len(set(past.values())) > max(1, cfg.max_outlier_frac * len(per_node)))
    blocks = {node for node, rs in per_node.items()
              if len(per_node) >= 2 and _together(sum(r.rank in soft for r in rs), len(rs), cfg)}
    current = {node for node in blocks if _together(sum(r.rank in soft_now for r in per_node[node]),
                                                     len(per_node[node]), cfg)}
    by_rank = {r.rank: (r, g) for r, g, _ in members}
    return Looks(group, len(members), thr, flagged, scores, tuple(r.rank for r, _ in with_sh),
                 _throttled_now(members, [r.rank for r, _, _ in members]), shift, frozenset(blocks),
                 frozenset(current), per_node, by_rank)


def _group(job: str, looks: Looks, cfg: DetectorConfig, per_step: StepShares | None = None) -> list[Candidate]:
    """The group's candidates: what its looks flagged, with its sequential tests on `per_step`."""
    thr, group, by_rank = looks.thr, looks.group, looks.by_rank
    # Copies down to each signal's evidence: the candidates carry them out to findings and alerts, and the looks
    # serve the judgements after this one.
    flagged = {rank: {signal: dict(ev) for signal, ev in signals.items()}  # type: ignore[call-overload]
               for rank, signals in looks.flagged.items()}
    scores = dict(looks.scores)

    def note(rank: int, signal: str, z: float, value: float, med: float, **extra: object) -> None:
        flagged.setdefault(rank, {})[signal] = {"value": round(value, 4), "peer_median": round(med, 4),
                                                "z": round(z, 2), **extra}
        scores[rank] = max(scores.get(rank, 0.0), abs(z))

    # Sequential evidence, step by step against this group's median rank: it fires as soon as it has lasted
    # long enough for its magnitude. Many ranks on many nodes at once is a shift (a heavier stage), as below.
    if per_step is not None:
        held = set(per_step.ranks)
        ids = [rank for rank in looks.share_ranks if rank in held]
        cols = per_step.columns(ids)
        medians = per_step.peer_medians(ids)
        seq = judge(cols, per_step.starts, per_step.ends, ids, cfg, medians=medians)
        # A rank whose GPU shows its own cause (a throttle reason, a low clock) is no workload transient: its
        # sequential evidence needs only the short minimum duration (corroborated_compute_test), not the one
        # that keeps the transients of healthy ranks from firing.
        caused = {k for k, sig in flagged.items() if not _GPU_CAUSE.isdisjoint(sig)}.intersection(ids)
        # The window's throttle fraction shows a cause only once it has lasted ~18 s of the minute; a GPU whose
        # newest two samples show a reason shows it now. It counts for a run it was seen in (its newest sample
        # taken after the run's first step began), and not while half the group is throttled (the room, not
        # the GPU: the windowed flag asks the same of its peers).
        now = {rank: looks.throttled_now[rank] for rank in ids if rank in looks.throttled_now}
        fast_for = (caused | set(now)) - set(seq)
        gpu_cause: dict[int, list[str]] = {}
        if fast_for:
            fast = judge(cols, per_step.starts, per_step.ends, ids, cfg, corroborated_compute_test(cfg),
                         only=fast_for, medians=medians)
            for rank, ev in fast.items():
                if rank in caused:
                    seq[rank] = ev
                elif now[rank][0] >= ev.start:
                    seq[rank] = ev
                    gpu_cause[rank] = list(now[rank][1])
        nodes = len(looks.per_node)
        if len(seq) <= max(1, cfg.max_outlier_frac * looks.peers) \
                or len({by_rank[k][0].node for k in seq}) <= max(1, cfg.max_outlier_frac * nodes):
            for rank, ev in seq.items():
                cause = {"gpu_cause": gpu_cause[rank]} if rank in gpu_cause else {}
                note(rank, "sequential", ev.z, ev.magnitude, 1.0, evidence=ev.evidence, steps=ev.steps,
                     span_s=ev.span_s, **cause)
    if looks.shift:  # keep only what a shift cannot explain: a throttle reason on the GPU itself
        for rank in [k for k, v in flagged.items() if "throttled" not in v]:
            del flagged[rank], scores[rank]
    out = []
    for rank, evidence in flagged.items():
        r, g = by_rank[rank]
        reasons = {"throttle_reasons": list(g.throttle_reasons)} if g is not None and g.throttle_reasons else {}
        mig = {"mig_profile": r.mig_profile} if r.mig_profile else {}
        out.append(Candidate("straggler", job, r.node, rank, r.gpu_uuid, round(scores[rank], 2),
                             {"group": group, "peers": looks.peers, "threshold_z": round(thr, 2),
                              "signals": evidence, **reasons, **mig},
                             corroborated=_corroborates(evidence),
                             sustained="sequential" in evidence))
    out.extend(_nodes(job, group, looks.per_node, flagged, scores, cfg))
    return out


def noise_floors(ranks: Sequence[RankFeatures]) -> dict[str, float]:
    """For the short and the recent look: how far apart the ranks' medians of the look's steps fall from their
    steps' own noise alone (a σ, for robust_z's floor): √(π/2) σ/√k for a median of k steps of noise σ, σ from
    the ranks' median `share_spread` (a MAD over all of each rank's recent steps, so steady however few the ranks)
    and k the median count of steps the look's medians are of. 0 for both without spreads. (The long look is a
    median over evaluations, not steps: it keeps its fixed floor.)

    The peers' MAD of the looks themselves is that σ's estimate from as many values as there are ranks: from
    eight it is often a fraction of the truth, and the z it divides inflates by as much (max modified z of 8
    Gaussian values passes 4.2, the threshold for eight, in 4.6 % of groups, not the 1e-4 the threshold is set
    for). The fixed floors keep this from mattering once a look holds a minute of steps; in a job's first seconds,
    with 10–20 steps a rank, they do not (three healthy 8-rank jobs of 511 were flagged pending in the fleet
    benchmark), while the steps' own noise, measured over every rank's steps, says what spread to expect."""
    with_spread = [r for r in ranks if r.share_spread is not None]
    if not with_spread:
        return {"short": 0.0, "recent": 0.0}
    sigma = MAD_TO_SIGMA * median([r.share_spread for r in with_spread])  # type: ignore[misc]
    counts = {"short": median([r.share_short_n for r in with_spread]),
              "recent": median([r.share_n for r in with_spread])}
    return {look: math.sqrt(math.pi / 2.0) * sigma / math.sqrt(max(k, 1)) for look, k in counts.items()}


def _sm_active(members: list[Member], activity: Mapping[str, float], thr: float, cfg: DetectorConfig,
               note: Callable[..., None]) -> None:
    """A rank whose GPU computes while its node's GPUs spin (SM activity high against theirs, sm_activity.py):
    judged only where the job pushes no comm wait (the compute share measures the same thing from exact
    timings), at the group's threshold plus few_steps_extra_z, and not at all when more than
    max_outlier_frac of the group stands out together (a shift, as for the other signals)."""
    xs = [(r, v) for r, _, sh in members if sh is None and (v := activity.get(r.gpu_uuid)) is not None]
    if len(xs) < cfg.min_peers:
        return
    past = _past(xs, _scored(xs, cfg.floor_sm_active), thr + cfg.few_steps_extra_z, +1)
    if len(past) > max(1, cfg.max_outlier_frac * len(members)):
        return
    for rank, (z, v, med) in past.items():
        note(rank, "sm_active", z, v, med)


def _throttled_now(members: list[Member], ids: Sequence[int]) -> dict[int, tuple[float, tuple[str, ...]]]:
    """rank → (when its GPU's newest sample was taken, the throttle reasons of its window) for the ranks among
    `ids` whose GPU shows a throttle reason in its newest two samples (GpuFeatures.throttled_newest); none when
    half the group's GPUs or more do."""
    wanted = set(ids)
    now = {r.rank: (g.throttled_newest, tuple(g.throttle_reasons)) for r, g, _ in members
           if g is not None and g.throttled_newest is not None}
    if 2 * len(now) >= len(members):
        return {}
    return {rank: v for rank, v in now.items() if rank in wanted}


def _past_index(zs: list[float], thr: float, sign: int) -> list[int]:
    """Indices of the z-scores past `thr` in the bad direction (sign=0: either), in order. Compared in one numpy
    pass (the same IEEE comparisons as Python's): a group holds thousands of ranks and a few are past."""
    z = np.asarray(zs, dtype=float)
    return np.flatnonzero((np.abs(z) if sign == 0 else sign * z) > thr).tolist()


def _corroborates(signals: object) -> bool:
    """A GPU's flags corroborate each other: its compute share and a cause on the GPU itself."""
    return "compute_share" in signals and not _GPU_CAUSE.isdisjoint(signals)  # type: ignore[arg-type, operator]


def _together(bad: int, on_node: int, cfg: DetectorConfig) -> bool:
    """Whether `bad` of a node's `on_node` GPUs deviating is the node deviating."""
    return bad >= cfg.node_min_gpus and 2 * bad >= on_node


def _nodes(job: str, group: str | None, per_node: Mapping[str, list[RankFeatures]],
           flagged: Mapping[int, object], scores: Mapping[int, float], cfg: DetectorConfig) -> list[Candidate]:
    out = []
    for node, rs in per_node.items():
        bad = [r for r in rs if r.rank in flagged]
        if len(per_node) >= 2 and _together(len(bad), len(rs), cfg):
            # Corroborated / sustained on the evidence of some of its GPUs alone, when those make the node: the
            # rest only add to it (they reach it at their own evaluations).
            corroborated = sum(_corroborates(flagged[r.rank]) for r in bad)
            sequential = sum("sequential" in flagged[r.rank] for r in bad)  # type: ignore[operator]
            out.append(Candidate("straggler_node", job, node, None, None,
                                 round(max(scores[r.rank] for r in bad), 2),
                                 {"group": group, "gpus_flagged": len(bad), "gpus_on_node": len(rs),
                                  "ranks": sorted(r.rank for r in bad)},
                                 corroborated=_together(corroborated, len(rs), cfg),
                                 sustained=_together(sequential, len(rs), cfg)))
    return out
