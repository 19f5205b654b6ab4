"""Running statistics (detectors/peer_rows.py): each job's per-step peer medians kept from its last judgement and
found again only for the steps whose cells changed give exactly what the reference path (every median found
afresh: FeatureFns(running=False)) gives — the same StepShares bit for bit, the same sequential evidence, the same
candidates, rank features and detector state — over sequences of judgements of a job whose window moves on:
steps pushed late and out of order, ranks pushing at their own moments, a rank restarted (its steps numbered again),
a rank gone, the window expiring, telemetry changing, judgements on arrival between the periodic ones."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumond.rules.columns import step_columns
from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.engine import DetectorState, EvalInputs, FeatureFns, evaluate
from gpumond.rules.detectors.peer_rows import PeerRows
from gpumond.rules.detectors.sequential import judge, step_shares, wait_test
from gpumond.rules.detectors.stats import row_nanmedian
from gpumond.rules.types import GpuSample, RankInfo, RankWindow, StepRecord

CFG = replace(DetectorConfig(), recent_s=20.0)  # a short window: steps leave it within a few judgements
T0 = 50_000.0
REFERENCE, RUNNING = FeatureFns(running=False), FeatureFns()


def bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype=np.float64).tobytes()


# ----- PeerRows alone -----------------------------------------------------------------------------
cell = st.sampled_from([0.0, -0.0, 0.1, 0.5, 0.5000000000000001, 1.0, math.nan, math.inf])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # all-NaN rows, as the detectors' callers have them
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(1, 5), st.integers(1, 4), st.data()), min_size=1,
                max_size=6))
def test_row_medians_kept_between_judgements_equal_those_found_afresh(frames) -> None:
    peers = None
    for first, rows, width, data in frames:
        x = np.array(data.draw(st.lists(st.lists(cell, min_size=width, max_size=width), min_size=rows,
                                        max_size=rows)), dtype=float)
        numbers = np.arange(first, first + rows, dtype=np.int64)
        peers = PeerRows(None if peers is None else peers.kept())
        assert bits(peers.medians(("m", width), x, numbers)) == bits(row_nanmedian(x))


def test_a_row_unchanged_since_the_last_judgement_is_not_found_again() -> None:
    x = np.arange(12.0).reshape(4, 3)
    first = PeerRows()
    first.medians("k", x, np.arange(10, 14))
    moved = np.vstack([x[1:], [[7.0, 8.0, 9.0]]])  # one step left the window, one arrived
    moved[0, 1] = 99.0  # and a cell of the (now) oldest step changed
    then = PeerRows(first.kept())
    assert bits(then.medians("k", moved, np.arange(11, 15))) == bits(row_nanmedian(moved))
    assert (then.rows, then.reused) == (4, 2)
    assert PeerRows(first.kept()).medians("other ranks", x, np.arange(10, 14)) is not None


# ----- a job judged again and again as its window moves on -----------------------------------------
@dataclass
class World:
    """A synchronous job of `n` ranks (1 s steps) as the store would hold it; ranks push at their own moments. Its
    GPUs are sampled every 2 s, enough samples in the short window for the GPU looks to compare them."""

    n: int
    slow: float
    starved: float
    seed: int
    now: float = T0
    done: int = 0  # steps the job has completed
    pushed: dict[int, int] = field(default_factory=dict)  # rank → steps it has pushed
    held: dict[int, list[StepRecord]] = field(default_factory=dict)
    epoch: dict[int, int] = field(default_factory=dict)  # rank → restarts
    late: dict[int, list[StepRecord]] = field(default_factory=dict)  # held back, pushed after later steps
    gpu_shift: float = 0.0
    fetches: int = 0  # telemetry fetches so far (EvalInputs.telemetry_seq)

    def step(self, r: int, k: int) -> StepRecord:
        rnd = random.Random(hash((self.seed, r, k, self.epoch.get(r, 0))))
        compute = 0.7 * (self.slow if r == 1 else 1.0) * (1 + rnd.uniform(-0.03, 0.03))
        wait = (self.starved if r == 2 else 0.002) * (1 + rnd.uniform(-0.1, 0.1))
        duration = 0.7 * self.slow + 0.1 + (self.starved if r == 2 else 0.0)
        end = T0 + k * 1.0 + rnd.uniform(-0.01, 0.01)
        comm = max(duration - compute - wait, 0.0)
        return StepRecord(k, end, duration, wait, None, None if r == 3 and k % 5 == 0 else comm)

    def advance(self, dt: float, who: list[int], hold_back: int | None) -> None:
        self.now += dt
        self.done = int(self.now - T0)
        for r in who:
            if r not in self.held:
                continue
            new = [self.step(r, k) for k in range(self.pushed.get(r, 0), self.done)]
            self.pushed[r] = self.done
            if hold_back == r and len(new) > 1:  # one step pushed after the next one: out of order
                self.late.setdefault(r, []).append(new.pop(-2))
            elif r in self.late:
                new += self.late.pop(r)
            self.held[r] += new

    def restart(self, r: int) -> None:
        if r in self.held:
            self.epoch[r] = self.epoch.get(r, 0) + 1
            self.held[r], self.late[r] = [], []
            self.pushed[r] = max(self.done - 3, 0)  # numbered again from its checkpoint

    def inputs(self) -> EvalInputs:
        cutoff = self.now - 300.0
        ranks, gpus = {}, {}
        for r, steps in self.held.items():
            steps[:] = [s for s in steps if s.end >= cutoff]
            info = RankInfo("job", r, self.n, f"node-{r // 4}", f"GPU-{r:03d}")
            ranks[r] = RankWindow(info, tuple(steps), self.now, step_columns(steps))
            values = {"sm_clock_hz": 1.9e9 - (self.gpu_shift if r in (0, 1) else 0.0), "sm_clock_max_hz": 1.98e9,
                      "power_w": 600.0, "power_limit_w": 700.0, "utilization": 0.99, "temperature_c": 70.0}
            gpus[info.gpu_uuid] = tuple(GpuSample(info.gpu_uuid, info.node, str(r % 4), self.now - 2.0 * i, True,
                                                  values) for i in range(8))[::-1]
        return EvalInputs(self.now, {"job": ranks} if ranks else {}, gpus, telemetry_seq=self.fetches)


def world(n: int, slow: float, starved: float, seed: int, start: int) -> World:
    w = World(n, slow, starved, seed)
    w.held = {r: [] for r in range(n)}
    w.advance(float(start), list(range(n)), None)
    return w


op = st.one_of(
    st.tuples(st.just("advance"), st.sampled_from([0.5, 1.0, 2.0, 5.0]), st.sets(st.integers(0, 11)),
              st.one_of(st.none(), st.integers(0, 11))),
    st.tuples(st.just("restart"), st.integers(0, 11)),
    st.tuples(st.just("drop"), st.integers(0, 11)),
    st.tuples(st.just("quiet"), st.sampled_from([10.0, 25.0])),  # nothing pushed: the window expires under it
    st.tuples(st.just("gpu"), st.sampled_from([0.0, 4e8])),  # a fetch: the pictures' GPUs measured again
    st.tuples(st.just("starve"), st.sampled_from([0.0, 0.3])),  # rank 2's loader slows or recovers
)


def same(a: tuple[DetectorState, list], b: tuple[DetectorState, list]) -> None:
    (sa, ca), (sb, cb) = a, b
    assert repr(ca) == repr(cb)  # repr: exact floats, NaN equal to NaN
    for name in ("rank_features", "baselines", "shares", "structure", "shares_since", "share_times", "judged"):
        assert repr(getattr(sa, name)) == repr(getattr(sb, name)), name


@settings(max_examples=60, deadline=None)
@given(st.integers(6, 12), st.sampled_from([1.0, 1.3, 2.0]), st.sampled_from([0.0, 0.3]), st.integers(0, 3),
       st.integers(8, 30), st.lists(st.tuples(op, st.booleans()), min_size=1, max_size=12))
def test_running_statistics_judge_exactly_as_the_reference(n, slow, starved, seed, start, ops) -> None:
    w = world(n, slow, starved, seed, start)
    ref = run = (DetectorState(), [])
    ref = evaluate(w.inputs(), ref[0], CFG, REFERENCE)
    run = evaluate(w.inputs(), run[0], CFG, RUNNING)
    same(ref, run)
    for (kind, *args), on_arrival in ops:
        if kind == "advance":
            dt, who, hold = args
            w.advance(dt, sorted(who) or list(range(n)), hold)
        elif kind == "restart":
            w.restart(args[0])
        elif kind == "drop":
            w.held.pop(args[0], None)
        elif kind == "quiet":
            w.now += args[0]
        elif kind == "starve":
            w.starved = args[0]
        else:
            w.gpu_shift = args[0]
            w.fetches += 1
        inputs = w.inputs()
        ref = evaluate(inputs, ref[0], CFG, REFERENCE, arrivals=on_arrival)
        run = evaluate(inputs, run[0], CFG, RUNNING, arrivals=on_arrival)
        same(ref, run)
        assert not ref[0].peer_rows  # the reference keeps nothing between judgements


def test_the_running_path_reuses_most_rows_of_a_steady_job_and_finds_its_straggler_as_the_reference_does() -> None:
    w = world(12, 1.3, 0.3, 0, 25)
    ref = run = (DetectorState(), [])
    reused = []
    for _ in range(8):
        w.advance(1.0, list(range(12)), None)
        inputs = w.inputs()
        before = run[0].peer_rows.get("job")
        ref = evaluate(inputs, ref[0], CFG, REFERENCE)
        run = evaluate(inputs, run[0], CFG, RUNNING)
        same(ref, run)
        if before is not None:
            shares = step_shares(inputs.jobs["job"], inputs.now - CFG.recent_s, peers=PeerRows(before))
            reused.append((shares.peers.reused, shares.peers.rows))
    assert {(c.kind, c.rank) for c in run[1]} >= {("straggler", 1), ("io_starved_rank", 2)}
    assert len(reused) == 7 and all(r >= rows - 6 > 0 for r, rows in reused)  # two matrices of ~21 steps: a step or two new in each


def test_sequential_evidence_with_kept_medians_equals_it_found_afresh() -> None:
    w = world(12, 1.3, 0.3, 1, 25)
    since = w.now - CFG.recent_s
    kept = PeerRows()
    for _ in range(5):
        afresh = step_shares(w.inputs().jobs["job"], since)
        shares = step_shares(w.inputs().jobs["job"], since, peers=kept)
        assert bits(shares.starts) == bits(afresh.starts) and bits(shares.ends) == bits(afresh.ends)
        ids = list(shares.ranks)
        for of, test in (("shares", None), ("waits", wait_test(CFG))):
            x = shares.columns(ids, of=of)
            assert judge(x, shares.starts, shares.ends, ids, CFG, test, medians=shares.peer_medians(ids, of)) == \
                judge(x, afresh.starts, afresh.ends, ids, CFG, test)
        kept = PeerRows(kept.kept())
        w.advance(1.0, list(range(0, 12, 2)), 4)
        since += 1.0
