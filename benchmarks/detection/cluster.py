"""A vectorised GPU-cluster simulator for detection: synchronous training steps with barrier semantics,
per-rank pushes and per-GPU NVML-like telemetry, emitted as the `EvalInputs` the rules service builds.

Time model. Each job runs steps back to back. In step k every rank r first waits on its data loader (and
any GC pause: the GPU idles, no kernels are launched), then computes for `c[r]`, then spins in the
step's collectives until the slowest rank of the job has finished and the exposed communication is done:
    T_k = max_r(wait[r] + gc[r] + c[r]) + comm
so every rank reports the same `duration_s` (the barrier) and its own `data_wait_s`. A synchronous
checkpoint appends a stall to the step: each rank writes (GPU idle) then spins in the barrier that ends it.

Telemetry. NVML's power and utilization are averages over about one second, so a sample at instant t
reports the mix of idle / compute / spin phases of its GPU's timeline in [t − 1 s, t]: utilization
counts compute *and* spin (an NCCL kernel is a kernel), power is idle / spin / compute power weighted by
that mix. Each node's agent samples on its own phase; the service scrapes every 5 s.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpumond.job.early import DEFAULT as EARLY_PUSH
from gpumond.job.early import history_len, push_early, regular_after_early, stand_out_above
from gpumond.rules.detectors.engine import EvalInputs
from gpumond.rules.columns import SampleBuffer, sample_matrix
from gpumond.rules.types import GpuSample, GpuWindow, HostSample, RankInfo, RankWindow, StepColumns, StepRecord

from benchmarks.detection.faults import Fault
from benchmarks.detection.noise import (
    CLOCK_STEP_HZ,
    IDLE_CLOCK_HZ,
    POWER_LIMIT_W,
    SM_CLOCK_MAX_HZ,
    Noise,
    compute_factor,
    gc_pauses,
    loader_wait,
    silicon,
    transient_episodes,
)

BIG = 1e18  # "never" (a hung step's end), finite so interval arithmetic stays NaN-free
_EARLY_PUSH_DELAY_S = 0.005  # from the step that stood out to its push: the push thread wakes and posts
GPU_KEYS = ("sm_clock_hz", "sm_clock_max_hz", "power_w", "power_limit_w", "utilization", "temperature_c",
            "throttle_hw_thermal", "throttle_sw_thermal", "throttle_hw_slowdown", "throttle_sw_power_cap",
            "throttle_hw_power_brake")
_REASON_KEY = {"hw_thermal": "throttle_hw_thermal", "hw_slowdown": "throttle_hw_slowdown",
               "hw_power_brake": "throttle_hw_power_brake"}
THERMAL_SLOWDOWN_C = 87.0  # a thermally throttled GPU sits at its slowdown temperature though it draws less power

# Real StepRecord / GpuSample objects, built through their slot descriptors: 3× faster than the frozen
# dataclass __init__, and indistinguishable to the detectors (same class, same fields, same equality).
_new = object.__new__
_SR = [StepRecord.__dict__[k].__set__ for k in ("step", "end", "duration_s", "data_wait_s", "samples",
                                                 "comm_wait_s")]
_GS = [GpuSample.__dict__[k].__set__ for k in ("uuid", "node", "gpu", "t", "up", "values", "jobs")]


def step_record(step: int, end: float, duration_s: float, data_wait_s: float,
                comm_wait_s: float | None = None) -> StepRecord:
    """A StepRecord, built fast."""
    o = _new(StepRecord)
    _SR[0](o, step), _SR[1](o, end), _SR[2](o, duration_s), _SR[3](o, data_wait_s), _SR[4](o, None)
    _SR[5](o, comm_wait_s)
    return o


def gpu_sample(uuid: str, node: str, gpu: str, t: float, values: dict, jobs: tuple[str, ...]) -> GpuSample:
    """A GpuSample, built fast."""
    o = _new(GpuSample)
    _GS[0](o, uuid), _GS[1](o, node), _GS[2](o, gpu), _GS[3](o, t), _GS[4](o, True), _GS[5](o, values)
    _GS[6](o, jobs)
    return o


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One training job: `nodes` whole nodes from `first_node`, 8 ranks each, one rank per GPU."""

    name: str
    nodes: int
    first_node: int = 0
    step_s: float = 2.0  # base compute time of one step
    stages: int = 1  # pipeline stages: contiguous, node-aligned rank blocks (PP outermost, as Megatron)
    stage_cost: tuple[float, ...] = ()  # compute multiplier per stage (uneven stages: not a fault)
    report_group: bool = False  # the job labels each rank's group with its stage


@dataclass(frozen=True, slots=True)
class _Step:
    start: float
    end: float
    bounds: np.ndarray  # (5, n) segment ends relative to start: idle | compute | spin | ckpt idle | ckpt spin


class _Job:
    """One job's timeline, push windows and per-rank fault state."""

    def __init__(self, spec: JobSpec, sim: Cluster, faults: Sequence[Fault], rng: np.random.Generator) -> None:
        self.spec, self.sim, self.rng = spec, sim, rng
        n = self.n = spec.nodes * 8
        self.g = np.arange(spec.first_node * 8, spec.first_node * 8 + n)
        self.node_idx = self.g // 8
        stage = (np.arange(n) * max(spec.stages, 1)) // n
        costs = spec.stage_cost or (1.0,) * max(spec.stages, 1)
        self.cost = np.asarray(costs, dtype=float)[stage]
        grouped = spec.report_group and spec.stages > 1
        self.infos = [RankInfo(spec.name, r, n, sim.node_names[self.node_idx[r]], sim.uuids[self.g[r]],
                               f"stage-{stage[r]}" if grouped else None) for r in range(n)]
        self.faults = [f for f in faults if f.job == spec.name]
        self.node_ranks = {sim.node_names[i]: np.flatnonzero(self.node_idx == i) for i in np.unique(self.node_idx)}
        self.p_spin = rng.uniform(*sim.noise.p_spin)
        self.t = sim.t0
        self.k = 0
        self.ends: list[float] = []
        self.recs: list[list[StepRecord]] = [[] for _ in range(n)]
        self.offset = 0  # index in `ends` of recs[r][0]
        # The same steps as columns (what the store keeps on ingest): cols[f, r, i] is field f (end, duration,
        # data wait, comm wait) of rank r's step col_base + i; step numbers are the step indices, shared.
        self.cols = self.cols_read = np.empty((4, n, 0))
        self.col_steps = np.empty(0, dtype=np.int64)
        self.col_base = 0
        self.col_keep = 0  # index in `ends` of the oldest step a window may still ask for
        self.recent: deque[_Step] = deque()
        self.hung = False
        self.push_phase = rng.uniform(0.0, sim.push_s, n)
        # Each rank's pushes, as the SDK's push thread makes them: every push_s after its previous push, and,
        # with early pushes on, at once after a step that stands out (gpumond/job/early.py decides, here as in
        # the SDK). last_push: the newest push scheduled so far (at most the newest step's end); pushes later
        # than the evaluation asking (`windows(now)`) wait in `queued` until it passes them. regular: the newest
        # beat of the regular cadence, which an early push leaves at its phase (early.regular_after_early).
        self.last_push = sim.t0 + self.push_phase - sim.push_s
        self.regular = self.last_push.copy()
        self.pushed_at = self.last_push.copy()
        self.queued: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self.early_above = np.full(n, math.inf)  # each rank's push thread's threshold, from the steps it pushed
        self.early_next = np.full(n, -math.inf)
        self.early_pushes = self.regular_pushes = 0  # requests made, for what early pushes cost
        self.skew = rng.normal(0.0, 0.001, n)  # host clocks differ by ~ms
        every = sim.noise.ckpt_every_s
        self.ckpt_next = sim.t0 + rng.uniform(0.2, 1.0) * every if every > 0 else BIG
        self.tr_end = np.full(n, -BIG)  # the transient episode each rank is in: until when, and how slow
        self.tr_factor = np.ones(n)
        self.tr_t = sim.t0  # episodes are drawn up to here

    # ----- faults at an instant -------------------------------------------------------------------
    def _mask(self, f: Fault) -> np.ndarray | int:
        if f.kind in ("slow_node", "starved_node"):
            return self.node_ranks[f.node]  # type: ignore[index]
        if f.kind == "starved_job":
            return slice(None)  # type: ignore[return-value]
        return f.rank  # type: ignore[return-value]

    def slow_state(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per rank at t: compute slowdown, visible clock ratio (1 when silent), reason index (-1 none)."""
        slow = np.ones(self.n)
        clock = np.ones(self.n)
        reason = np.full(self.n, -1)
        for f in self.faults:
            if f.kind in ("slow_gpu", "slow_node") and f.active(t):
                m = self._mask(f)
                slow[m] *= f.slowdown
                if f.visible:
                    clock[m] = 1.0 / f.slowdown
                    reason[m] = list(_REASON_KEY).index(f.reason)  # type: ignore[arg-type]
        return slow, clock, reason

    def _transients(self, start: float, c: np.ndarray) -> np.ndarray:
        """Each rank's compute factor this step from transient episodes: new ones drawn for the time since the
        previous step began, and a step overlapping an episode only in part slowed in proportion."""
        noise, rng = self.sim.noise, self.rng
        dt, self.tr_t = start - self.tr_t, start
        who, dur, fac = transient_episodes(rng, self.n, noise.transient_rate_h, dt, noise.transient_median_s, noise)
        self.tr_end[who], self.tr_factor[who] = start + dur, fac
        nodes = self.spec.nodes
        who, dur, fac = transient_episodes(rng, nodes, noise.transient_node_rate_h, dt,
                                           noise.transient_node_median_s, noise)
        for i, d, f in zip(who.tolist(), dur.tolist(), fac.tolist(), strict=True):
            ranks = slice(8 * i, 8 * i + 8)
            self.tr_end[ranks], self.tr_factor[ranks] = start + d, f
        overlap = np.clip((self.tr_end - start) / np.maximum(c, 1e-9), 0.0, 1.0)
        return 1.0 + (self.tr_factor - 1.0) * overlap

    # ----- steps ----------------------------------------------------------------------------------
    def run_until(self, until: float) -> None:
        """Generate steps until the timeline covers `until` (or the job hung)."""
        while not self.hung and self.t < until:
            self._step()

    def _step(self) -> None:
        rng, noise, n, base = self.rng, self.sim.noise, self.n, self.spec.step_s
        start = self.t
        slow, _, _ = self.slow_state(start)
        wait_frac = np.zeros(n)
        hung_rank = None
        for f in self.faults:
            if not f.active(start):
                continue
            if f.kind in ("starved_rank", "starved_sub", "starved_node"):
                wait_frac[self._mask(f)] = f.wait_frac
            elif f.kind == "starved_job":
                # one shared pipeline, but each rank's loader drains at its own pace
                wait_frac = f.wait_frac * np.clip(rng.lognormal(0.0, 0.25, n), 0.5, 1.8)
            elif f.kind == "starved_outlier":
                # the job's pipeline a little slow (spread as above), the outlier's own loader far slower
                wait_frac = np.maximum(wait_frac, f.base_wait * np.clip(rng.lognormal(0.0, 0.25, n), 0.5, 1.8))
                wait_frac[f.rank] = f.wait_frac
            elif f.kind == "hung_rank":
                hung_rank = f.rank
        comm = noise.comm_frac * base
        c = base * self.cost * slow * compute_factor(rng, n, noise) * (1.0 + noise.common_sigma * rng.standard_normal())
        if noise.transient_rate_h > 0 or noise.transient_node_rate_h > 0:
            c = c * self._transients(start, c)
        w = loader_wait(rng, n, base, noise)
        starved = wait_frac > 0
        if starved.any():
            # a rank whose loader is slower than its compute waits the difference every step; chosen so
            # its wait is `wait_frac` of a step it bottlenecks: w = f·(w + c + comm)
            wf = np.minimum(wait_frac, 0.95)
            w = np.where(starved, wf / (1 - wf) * (c + comm) * rng.lognormal(0.0, 0.15, n), w)
        gc = gc_pauses(rng, n, noise)
        b0 = w + gc
        b1 = b0 + c
        if hung_rank is not None:
            # Onset: the hung rank never reaches the collective; its peers compute, then spin forever.
            b0[hung_rank] = b1[hung_rank] = BIG
            big = np.full(n, BIG)
            self.recent.append(_Step(start, BIG, np.stack([b0, b1, big, big, big])))
            self.hung = True
            return
        t_pre = float(b1.max()) + comm * (1.0 + 0.05 * rng.standard_normal())
        dur = t_pre
        u = np.ones(n)
        ck = 0.0
        if start >= self.ckpt_next:
            ck = rng.uniform(*noise.ckpt_s)
            self.ckpt_next += noise.ckpt_every_s
            u = rng.uniform(0.6, 1.0, n)  # each rank writes its shard (GPU idle), then waits in the barrier
            dur += ck
        end = start + dur
        pre = np.full(n, t_pre)
        self.recent.append(_Step(start, end, np.stack([b0, b1, pre, pre + u * ck, np.full(n, dur)])))
        while self.recent and self.recent[0].end < start - 10.0:
            self.recent.popleft()
        k = self.k
        ends = (end + self.skew).tolist()
        durs = np.maximum(dur + rng.normal(0.0, 2e-4, n), 1e-3)
        if self.sim.comm_wait:
            # What the SDK's timed collective reads: from this rank's compute end to the step's collective
            # end, plus ~0.5 ms of host timing noise; never more than the step minus its data wait.
            cw = np.clip(t_pre - b1 + np.abs(rng.normal(0.0, 5e-4, n)), 0.0, durs - w).tolist()
        else:
            cw = [None] * n
        for lst, e, d, ww, cc in zip(self.recs, ends, durs.tolist(), w.tolist(), cw, strict=True):
            lst.append(step_record(k, e, d, ww, cc))
        self._append_columns(k, end + self.skew, durs, w, np.array(cw, dtype=float))
        self.ends.append(end)
        self._push(k, end, durs)
        self.t = end
        self.k += 1

    def _append_columns(self, k: int, end: np.ndarray, dur: np.ndarray, wait: np.ndarray, comm: np.ndarray) -> None:
        i = k - self.col_base
        if i >= self.cols.shape[2]:
            # New arrays rather than a shift in place: windows handed out keep viewing the old ones.
            lo = self.col_keep - self.col_base
            live = i - lo
            cap = max(64, 2 * (live + 1))
            cols = np.empty((4, self.n, cap))
            cols[:, :, :live] = self.cols[:, :, lo:i]
            steps = np.arange(self.col_keep, self.col_keep + cap, dtype=np.int64)
            steps.flags.writeable = False
            self.cols, self.col_steps, self.col_base, i = cols, steps, self.col_keep, live
            self.cols_read = cols.view()
            self.cols_read.flags.writeable = False  # windows slice this: read-only without a flag per view
        self.cols[:, :, i] = (end, dur, wait, comm)

    # ----- pushes ---------------------------------------------------------------------------------
    def _push(self, k: int, end: float, durs: np.ndarray) -> None:
        """The pushes up to step k's end: regular ones due before it (carrying steps before k), then the early
        ones this step asks for (carrying it)."""
        sim = self.sim
        due = np.flatnonzero(self.regular + sim.push_s <= end)
        if len(due):
            beats = np.floor((end - self.regular[due]) / sim.push_s)
            self.regular_pushes += int(beats.sum())
            # Every beat is a push (a heartbeat when no step ended since): a long step (a checkpoint) spans
            # several, and an evaluation inside it must see the one just before it, not wait for the step's end.
            # The queue stays in time order: beat b of every rank lies within the b-th interval after step k − 1.
            start = self.regular[due]
            for b in range(1, int(beats.max()) + 1):
                who = beats >= b
                self.queued.append((start[who] + b * sim.push_s, due[who]))
            times = start + beats * sim.push_s
            self.regular[due] = times
            self.last_push[due] = np.maximum(self.last_push[due], times)
            self._threshold(due, k - 1)
        if not sim.early_push or k < 1:
            return
        above, nxt = self.early_above.tolist(), self.early_next.tolist()
        early = [r for r, d in enumerate(durs.tolist()) if push_early(d, above[r], end, nxt[r])]
        if early:
            who = np.asarray(early)
            at = end + _EARLY_PUSH_DELAY_S
            self.early_next[who] = end + EARLY_PUSH.min_gap_s
            self.last_push[who] = at
            for r in early:
                self.regular[r] = regular_after_early(self.regular[r] + sim.push_s, at, sim.push_s,
                                                      EARLY_PUSH) - sim.push_s
            self.queued.append((np.full(len(who), at), who))
            self._threshold(who, k)
            self.early_pushes += len(who)

    def _threshold(self, ranks: np.ndarray, k: int) -> None:
        """What these ranks' push threads derive from their steps up to k (the newest each push took)."""
        if k < 0:
            return
        ends = self.ends
        within = k + 1 - bisect.bisect_left(ends, ends[k] - EARLY_PUSH.history_s, 0, k + 1)
        lo = max(k + 1 - history_len(within, k + 1, EARLY_PUSH), self.col_base)
        durations = self.cols[1, :, lo - self.col_base:k + 1 - self.col_base]
        for r in ranks.tolist():
            self.early_above[r] = stand_out_above(durations[r].tolist(), EARLY_PUSH)

    def _pushed_by(self, now: float) -> np.ndarray:
        """Each rank's newest push at or before `now`."""
        queued, at = self.queued, self.pushed_at
        while queued:
            times, ranks = queued[0]
            done = times <= now
            np.maximum.at(at, ranks[done], times[done])
            if not done.all():
                queued[0] = (times[~done], ranks[~done])
                break
            queued.popleft()
        if not queued and now > self.last_push.min():
            # No step since (a hung job): its push threads still push (heartbeats) every push_s.
            sim = self.sim
            beat = self.regular + np.floor(np.maximum(now - self.regular, 0.0) / sim.push_s) * sim.push_s
            at = np.maximum(at, beat)
        return at

    # ----- what the service holds -----------------------------------------------------------------
    def windows(self, now: float) -> dict[int, RankWindow]:
        """RankWindows as the store would hand them out at `now`: steps pushed so far, within window_s."""
        sim = self.sim
        ends = np.asarray(self.ends)
        lo = int(np.searchsorted(ends, now - sim.window_s, "left"))
        if lo - self.offset > 256:  # compact the per-rank lists now and then
            cut = lo - self.offset
            for lst in self.recs:
                del lst[:cut]
            self.offset = lo
        last_push = self._pushed_by(now)
        hi = np.searchsorted(ends, last_push, "right")
        a = lo - self.offset
        self.col_keep = max(self.col_keep, lo)
        ca, shift = lo - self.col_base, self.offset - self.col_base
        cols, steps = self.cols_read, self.col_steps
        out = {}
        for r, (info, lst, h, lp) in enumerate(zip(self.infos, self.recs, (hi - self.offset).tolist(),
                                                    last_push.tolist(), strict=True)):
            values = cols[:, r, ca:h + shift]
            # The simulated processes never die: each push time is also a heartbeat (the SDK's push without
            # steps when there is nothing to report), which is what tells a hang from an ended job.
            out[r] = RankWindow(info, tuple(lst[a:h]), lp, StepColumns(steps[ca:h + shift], values), last_beat=lp)
        return out

    def phases(self, t: np.ndarray, width: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Seconds each rank spent idle / computing / spinning in [t − width, t] (t per rank)."""
        n = self.n
        lo = t - width
        idle, comp, spin = np.zeros(n), np.zeros(n), np.zeros(n)
        tmin, tmax = float(lo.min()), float(t.max())
        kinds = (idle, comp, spin, idle, spin)
        for st in self.recent:
            if st.end <= tmin or st.start >= tmax:
                continue
            prev = np.full(n, st.start)
            for j, acc in enumerate(kinds):
                nxt = st.start + st.bounds[j]
                acc += np.clip(np.minimum(nxt, t) - np.maximum(prev, lo), 0.0, None)
                prev = nxt
        return idle, comp, spin


class Cluster:
    """N nodes × 8 GPUs running `jobs`, with `faults` planted; advance it and ask for EvalInputs."""

    def __init__(self, jobs: Sequence[JobSpec], faults: Sequence[Fault] = (), noise: Noise = Noise(),
                 seed: int = 0, t0: float = 1_700_000_000.0, window_s: float = 300.0, recent_s: float = 60.0,
                 scrape_s: float = 5.0, push_s: float = 5.0, energy: bool = True, comm_wait: bool = True,
                 gpm: float = 0.0, early_push: bool = True) -> None:
        self.noise, self.t0, self.window_s, self.recent_s = noise, t0, window_s, recent_s
        # energy=True adds "energy_j" (gpumond_gpu_energy_joules_total, which the agent exports but the
        # service does not map today) to each sample: only for the detector-change experiments.
        self.energy = energy
        # comm_wait=True: ranks push comm_wait_s (an SDK timing a collective each step); False: older SDKs.
        self.comm_wait = comm_wait
        self.scrape_s, self.push_s = scrape_s, push_s
        # early_push=True, the SDK's default: ranks also push at once after a step that stands out; False: only
        # every push_s (an SDK with push_early=False).
        self.early_push = early_push
        self.faults = tuple(faults)
        rng = self.rng = np.random.default_rng(seed)
        n_nodes = max(j.first_node + j.nodes for j in jobs)
        self.n_nodes, self.n_gpus = n_nodes, n_nodes * 8
        self.node_names = [f"node-{i:05d}" for i in range(n_nodes)]
        self.uuids = [f"GPU-{i // 8:05d}-{i % 8}" for i in range(self.n_gpus)]
        self.pf, self.rth, self.toff = silicon(rng, self.n_gpus, noise)
        self.node_phase = rng.uniform(0.0, 1.0, n_nodes)  # each agent samples on its own phase
        self.cpu_base = rng.uniform(0.15, 0.4, n_nodes)
        self.iowait_base = rng.uniform(0.005, 0.03, n_nodes)
        self.disk_rate = rng.uniform(1e8, 3e8, n_nodes)
        self.disk_total = rng.uniform(1e12, 5e12, n_nodes)
        self.p_ema = np.full(self.n_gpus, np.nan)
        self.hot_ema = np.zeros(self.n_gpus)
        self.energy_j = rng.uniform(1e8, 1e9, self.n_gpus)
        self.jobs = [_Job(j, self, faults, np.random.default_rng([seed, i])) for i, j in enumerate(jobs)]
        # gpm: the share of nodes whose GPUs have GPM (Hopper and later; the rest a model without it, which
        # exports no sm_active / tensor_active). Drawn from their own stream, so the run with GPM sees the
        # same steps and the same other telemetry as the run without: a paired comparison.
        self.gpm_rng = np.random.default_rng([seed, 7022])
        self.gpm_nodes = self.gpm_rng.random(n_nodes) < gpm if gpm > 0 else np.zeros(n_nodes, dtype=bool)
        self.gpm_levels = [(self.gpm_rng.uniform(*noise.sm_active_compute), self.gpm_rng.uniform(*noise.sm_active_spin),
                            self.gpm_rng.uniform(*noise.tensor_per_sm)) for _ in jobs]
        self.gpu_win: dict[str, deque[GpuSample]] = {}
        self.gpu_cols: dict[str, SampleBuffer] = {}  # the same samples as columns (as the GpuStore keeps them)
        self.host_win: dict[str, deque[HostSample]] = {}
        self.absent: frozenset[str] = frozenset()
        self.next_scrape = t0 + rng.uniform(0.0, scrape_s)
        self.scrapes = 0  # taken so far: the inputs' telemetry_seq, as the service's GpuStore counts its fetches
        self.t = t0

    def advance_to(self, now: float, telemetry_from: float = 0.0) -> None:
        """Run every job and take every scrape up to `now` (none before `telemetry_from`: a shortcut for
        builds that only need the last window)."""
        while self.next_scrape <= now:
            ts = self.next_scrape
            for j in self.jobs:
                j.run_until(ts)
            if ts >= telemetry_from:
                self._scrape(ts)
            self.next_scrape += self.scrape_s
        for j in self.jobs:
            j.run_until(now)
        self.t = now

    def inputs(self, now: float) -> EvalInputs:
        """What the service's evaluator would hand the detectors at `now` (rank windows of window_s,
        telemetry since now − recent_s, nodes whose latest scrape failed as absent)."""
        since = now - self.recent_s
        jobs = {j.spec.name: j.windows(now) for j in self.jobs}
        gw = {}
        for j in self.jobs:
            for info in j.infos:
                samples = _since(self.gpu_win.get(info.gpu_uuid, ()), since)
                cols = self.gpu_cols.get(info.gpu_uuid)
                gw[info.gpu_uuid] = GpuWindow(samples, cols.columns(len(samples)) if cols is not None else None)
        hw = {node: _since(self.host_win.get(node, ()), since) for j in self.jobs for node in j.node_ranks}
        return EvalInputs(now, jobs, gw, hw, self.absent, telemetry_seq=self.scrapes)

    # ----- telemetry ------------------------------------------------------------------------------
    def _scrape(self, ts: float) -> None:
        self.scrapes += 1
        noise, rng = self.noise, self.rng
        node_down = rng.random(self.n_nodes) < noise.node_miss_p
        alpha = 1.0 - np.exp(-self.scrape_s / 25.0)  # board temperature lags power by ~25 s
        absent = set()
        for i_job, j in enumerate(self.jobs):
            n, g = j.n, j.g
            t = ts - self.node_phase[j.node_idx]  # the agent's latest 1 Hz sample
            idle, comp, spin = j.phases(t, 1.0)
            gpm = self._gpm(i_job, j, comp, spin)
            tot = idle + comp + spin
            idle = idle + np.maximum(1.0 - tot, 0.0)  # before the job's first step: idle
            idle_long = j.phases(t, 2.5)[0] >= 2.5 - 1e-9  # no kernel for 2.5 s: clocks drop to idle
            _, clock_ratio, reason = j.slow_state(ts)
            throttled = reason >= 0
            pc = noise.p_compute * np.where(throttled, clock_ratio ** 1.5, 1.0)  # lower clock, lower V: less power
            p = POWER_LIMIT_W * self.pf[g] * (comp * pc + spin * j.p_spin + idle * noise.p_idle)
            p = np.minimum(p * (1.0 + noise.power_meas_sigma * rng.standard_normal(n)), POWER_LIMIT_W * 1.02)
            pe = self.p_ema[g]
            pe = np.where(np.isnan(pe), p, pe + alpha * (p - pe))
            self.p_ema[g] = pe
            hot = np.where(throttled & (reason == 0), 1.0, 0.0)  # cooling failed: heats up to the limit
            self.hot_ema[g] += alpha * (hot - self.hot_ema[g])
            natural = self.toff[g] + self.rth[g] * pe
            temp = natural + self.hot_ema[g] * np.maximum(THERMAL_SLOWDOWN_C - natural, 0.0)
            temp = np.round(temp + noise.temp_meas_sigma * rng.standard_normal(n))
            busy = comp + spin
            util = np.clip(busy + noise.util_meas_sigma * rng.standard_normal(n) * (busy > 0), 0.0, 1.0).round(2)
            jit = rng.random(n)
            clk = SM_CLOCK_MAX_HZ - CLOCK_STEP_HZ * ((jit < 0.2).astype(float) + (jit < 0.05))
            clk = np.where(throttled, np.round(SM_CLOCK_MAX_HZ * clock_ratio / CLOCK_STEP_HZ) * CLOCK_STEP_HZ
                           - CLOCK_STEP_HZ * (jit < 0.3), clk)
            clk = np.where(idle_long, IDLE_CLOCK_HZ, clk)
            bits = np.zeros((5, n))
            shows = throttled & (rng.random(n) < 0.95)
            bits[0] = shows & (reason == 0)  # hw_thermal
            bits[1] = rng.random(n) < noise.sw_thermal_event_p  # sw_thermal
            bits[2] = shows & (reason == 1)  # hw_slowdown
            bits[3] = (rng.random(n) < noise.power_cap_event_p) & (comp > 0.5)  # sw_power_cap
            bits[4] = shows & (reason == 2)  # hw_power_brake
            if self.energy:  # the counter integrates the exact power timeline since the last scrape
                ei, ec, es = j.phases(t, self.scrape_s)
                ei = ei + np.maximum(self.scrape_s - (ei + ec + es), 0.0)
                self.energy_j[g] += POWER_LIMIT_W * self.pf[g] * (ec * pc + es * j.p_spin + ei * noise.p_idle)
            missing = (rng.random(n) < noise.sample_miss_p) | node_down[j.node_idx]
            rows = zip(clk.tolist(), p.tolist(), util.tolist(), temp.tolist(), *bits.tolist(), strict=True)
            jobs = (j.spec.name,)
            added: list[GpuSample] = []
            for r, (row, miss) in enumerate(zip(rows, missing.tolist(), strict=True)):
                if miss:
                    continue
                info = j.infos[r]
                values = {"sm_clock_hz": row[0], "sm_clock_max_hz": SM_CLOCK_MAX_HZ, "power_w": row[1],
                          "power_limit_w": POWER_LIMIT_W, "utilization": row[2], "temperature_c": row[3],
                          "throttle_hw_thermal": row[4], "throttle_sw_thermal": row[5],
                          "throttle_hw_slowdown": row[6], "throttle_sw_power_cap": row[7],
                          "throttle_hw_power_brake": row[8]}
                if self.energy:
                    values["energy_j"] = float(self.energy_j[g[r]])
                if gpm is not None and self.gpm_nodes[j.node_idx[r]]:
                    values["sm_active"], values["tensor_active"] = gpm[0][r], gpm[1][r]
                dq = self.gpu_win.get(info.gpu_uuid)
                if dq is None:
                    dq = self.gpu_win[info.gpu_uuid] = deque(maxlen=16)
                    self.gpu_cols[info.gpu_uuid] = SampleBuffer()
                elif len(dq) == dq.maxlen:
                    self.gpu_cols[info.gpu_uuid].drop(1)  # the deque drops its oldest on this append
                sample = gpu_sample(info.gpu_uuid, info.node, str(g[r] % 8), ts, values, jobs)
                dq.append(sample)
                added.append(sample)
            for sample, column in zip(added, sample_matrix(added).T, strict=True):
                self.gpu_cols[sample.uuid].append(column)
            self._hosts(j, ts, node_down, absent)
        self.absent = frozenset(absent)

    def _gpm(self, i_job: int, j: _Job, comp: np.ndarray, spin: np.ndarray) -> tuple[list, list] | None:
        """SM and tensor activity of the job's GPUs over the agent's last 1 s interval (None: no node has GPM).
        The GPU that computes while its peers spin in the collective reads higher SM activity; every one of
        them reads ~100 % utilization."""
        if not self.gpm_nodes[j.node_idx].any():
            return None
        a_compute, a_spin, tensor = self.gpm_levels[i_job]
        rng, sigma = self.gpm_rng, self.noise.gpm_meas_sigma
        sm = np.clip((comp * a_compute + spin * a_spin) * (1.0 + sigma * rng.standard_normal(j.n)), 0.0, 1.0)
        tc = np.clip(comp * a_compute * tensor * (1.0 + sigma * rng.standard_normal(j.n)), 0.0, 1.0)
        return sm.round(4).tolist(), tc.round(4).tolist()

    def _hosts(self, j: _Job, ts: float, node_down: np.ndarray, absent: set[str]) -> None:
        rng = self.rng
        cpu_hot, io_hot, remote = set(), set(), False
        for f in j.faults:
            if f.active(ts) and f.kind in ("starved_rank", "starved_node", "starved_sub", "starved_job",
                                           "starved_outlier"):
                on_rank = f.kind in ("starved_rank", "starved_outlier")
                node = j.infos[f.rank].node if on_rank else f.node  # type: ignore[index]
                if f.kind == "starved_job":
                    remote = True  # shared storage: the hosts look normal
                elif f.cause == "cpu":
                    cpu_hot.add(node)
                elif f.cause == "storage":
                    io_hot.add(node)
        names = list(j.node_ranks)
        idx = np.array([int(n[5:]) for n in names])
        k = len(idx)
        cpu = self.cpu_base[idx] + 0.03 * rng.standard_normal(k)
        iow = self.iowait_base[idx] + 0.005 * np.abs(rng.standard_normal(k)) + (0.02 if remote else 0.0)
        rate = self.disk_rate[idx].copy()
        for i, node in enumerate(names):
            if node in cpu_hot:
                cpu[i] = rng.uniform(0.93, 0.99)
            if node in io_hot:
                iow[i], rate[i] = rng.uniform(0.2, 0.45), rate[i] * 0.3
        self.disk_total[idx] += rate * self.scrape_s
        down = node_down[idx].tolist()
        for node, d, c, w, tot in zip(names, down, np.clip(cpu, 0, 1).tolist(), np.clip(iow, 0, 1).tolist(),
                                      self.disk_total[idx].tolist(), strict=True):
            if d:
                absent.add(node)
                continue
            dq = self.host_win.get(node)
            if dq is None:
                dq = self.host_win[node] = deque(maxlen=16)
            dq.append(HostSample(node, ts, {"cpu_utilization": c, "cpu_iowait": w, "disk_read_bytes_total": tot,
                                            "memory_used_bytes": 4.0e11}))


def _since(window: Sequence, since: float) -> tuple:
    """The samples at or after `since` (as GpuStore.window does)."""
    samples = tuple(window)
    i = len(samples)
    while i and samples[i - 1].t >= since:
        i -= 1
    return samples[i:]
