"""The straggler detector's peer looks kept on a job's picture (straggler.Looks, engine.Windowed.looks): a
judgement on arrival takes the looks its picture's periodic judgement found instead of finding them again, and
gives exactly what finding them afresh gives — for the same starved ranks and nodes split off only, since the
looks are found on the ranks that are not starved. The property test of tests/unit/test_running_peer_medians.py
holds whole sequences of judgements equal to the reference path; these pin the keys."""

from __future__ import annotations

from dataclasses import replace

from gpumond.rules.detectors.compute_share import Shares
from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.engine import _stragglers
from gpumond.rules.detectors.features import GpuFeatures, RankFeatures
from gpumond.rules.detectors.straggler import detect_stragglers

CFG = DetectorConfig()
T = 1000.0


def _job(slow: int, n: int = 16) -> tuple[list[RankFeatures], dict[str, GpuFeatures], dict[int, Shares]]:
    """n ranks on n/4 nodes, every GPU healthy; rank `slow` computes 30 % longer than its peers on every look."""
    ranks = [RankFeatures(r, f"node-{r // 4}", f"GPU-{r}", None, 60, 1.0, 0.01, T, T, share_spread=0.01,
                          share_n=60, share_short_n=10) for r in range(n)]
    gpus = {f"GPU-{r}": GpuFeatures(f"GPU-{r}", f"node-{r // 4}", 12, True, 0.96, 0.8, 0.99, 70.0 + r % 3, 0.0)
            for r in range(n)}
    shares = {r: Shares(*(3 * [0.3 + 0.001 * (r % 5) + (0.3 if r == slow else 0.0)]), ()) for r in range(n)}
    return ranks, gpus, shares


def _flagged(result) -> set[tuple[str, int | None]]:
    return {(c.kind, c.rank) for c in result.candidates}


def test_looks_kept_from_one_judgement_give_the_next_exactly_what_finding_them_again_gives():
    ranks, gpus, shares = _job(slow=5)
    kept: dict = {}
    first = detect_stragglers("j", ranks, gpus, CFG, shares, looks=kept)
    assert ("straggler", 5) in _flagged(first) and list(kept) == [frozenset()]
    groups = kept[frozenset()]
    again = detect_stragglers("j", ranks, gpus, CFG, shares, looks=kept)
    assert kept[frozenset()] is groups  # taken, not found again
    assert repr(again) == repr(detect_stragglers("j", ranks, gpus, CFG, shares))
    assert repr(again) == repr(first)


def test_a_judgement_cannot_change_the_looks_it_took():
    """Each judgement adds its sequential evidence to a copy of what the looks flagged, down to each signal's
    evidence: what its candidates carry out (to findings, alerts, whoever reads them) is not the looks' own, and
    the next judgement that takes them starts from the looks alone."""
    ranks, gpus, shares = _job(slow=5)
    kept: dict = {}
    fresh = repr(detect_stragglers("j", ranks, gpus, CFG, shares))
    detect_stragglers("j", ranks, gpus, CFG, shares, looks=kept)
    (looks,) = kept[frozenset()]
    before = repr(looks.flagged), repr(looks.scores), repr(looks.throttled_now)
    (slow,) = [c for c in detect_stragglers("j", ranks, gpus, CFG, shares, looks=kept).candidates if c.rank == 5]
    slow.evidence["signals"]["extra"] = 1
    slow.evidence["signals"]["compute_share"]["z"] = 0.0
    assert (repr(looks.flagged), repr(looks.scores), repr(looks.throttled_now)) == before
    assert repr(detect_stragglers("j", ranks, gpus, CFG, shares, looks=kept)) == fresh


def test_looks_are_kept_apart_for_each_set_of_starved_ranks():
    """A rank found starved since the picture's periodic judgement is left out of the looks: a judgement on
    arrival with another starved set finds (and keeps) the looks again. Taking the periodic's would still flag
    the starved rank on a compute share that its wait explains."""
    ranks, gpus, shares = _job(slow=5)
    looks: dict = {}
    periodic = _stragglers("j", ranks, gpus, CFG, shares, set(), None, None, {}, looks)
    assert ("straggler", 5) in _flagged(periodic)
    on_arrival = _stragglers("j", ranks, gpus, CFG, shares, {5}, None, None, {}, looks)
    assert repr(on_arrival) == repr(_stragglers("j", ranks, gpus, CFG, shares, {5}, None, None, {}))
    assert ("straggler", 5) not in _flagged(on_arrival)
    assert set(looks) == {frozenset(), frozenset({5})}


def test_looks_are_kept_apart_for_each_set_of_nodes_split_off():
    """While a job's structure is learnt the detector judges it whole and with the deviating nodes apart: each
    split has its own looks."""
    ranks, gpus, shares = _job(slow=-1, n=24)
    heavy = {r: replace(sh, short=sh.short + 0.2, recent=sh.recent + 0.2, long=sh.long + 0.2)  # a heavier stage
             for r, sh in shares.items() if r < 8}
    shares = shares | heavy
    kept: dict = {}
    learning = detect_stragglers("j", ranks, gpus, CFG, shares, learning=True, looks=kept)
    assert learning.blocks == {"node-0", "node-1"}
    assert set(kept) == {frozenset(), frozenset({"node-0", "node-1"})}
    assert repr(detect_stragglers("j", ranks, gpus, CFG, shares, learning=True, looks=kept)) \
        == repr(detect_stragglers("j", ranks, gpus, CFG, shares, learning=True))


def test_a_picture_measured_again_after_a_fetch_finds_its_looks_again():
    """Telemetry fetched since the picture: a judgement on arrival measures the GPUs again, and the looks (which
    read them) with them. Here the slow rank's clock drops in the fetch: its sequential finding then names the
    clock among its signals, as the reference path's does."""
    from tests.unit.test_running_peer_medians import CFG as SHORT, REFERENCE, RUNNING, same, world

    from gpumond.rules.detectors.engine import DetectorState, evaluate

    w = world(12, 1.3, 0.0, 0, 25)
    ref = run = (DetectorState(), [])
    for _ in range(3):
        w.advance(1.0, list(range(12)), None)
        ref, run = (evaluate(w.inputs(), s[0], SHORT, fns) for s, fns in ((ref, REFERENCE), (run, RUNNING)))
        same(ref, run)
    picture = run[0].windowed["job"]
    assert picture.looks  # found by the periodic judgement
    w.gpu_shift, w.fetches = 4e8, w.fetches + 1
    w.advance(1.0, list(range(12)), None)
    ref, run = (evaluate(w.inputs(), s[0], SHORT, fns, arrivals=True) for s, fns in ((ref, REFERENCE), (run, RUNNING)))
    same(ref, run)
    assert run[0].windowed["job"] is not picture and run[0].windowed["job"].looks is not picture.looks
    slow = [c for c in run[1] if c.kind == "straggler" and c.rank == 1]
    assert slow and "sm_clock_ratio" in slow[0].evidence["signals"]
