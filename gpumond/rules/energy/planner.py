"""Power-slack offers in the running service: each evaluation interval, for every synchronous job whose ranks
time their comm wait, the closed loop (loop.py) and each GPU's recommendation (slack.py) from the detectors'
per-rank compute shares and the GPU's measured operating points; served per node to the agents, which decide.

A GPU's operating points come from its telemetry: per power limit it ran under, the busiest quarter of its
samples (the compute phase, where the limit binds) as one (mean SM clock, mean power) point; kept while the
same job holds the GPU, so the points measured under earlier limits stay known as the limit walks down.
A rank on a MIG slice gets no offer (a limit is the whole board's). After a GPU's limit changes, its offer
holds that limit for the detectors' recent window (`recent_s`): until then the compute shares and the point
are partly of the previous limit, and a loop stepping on them walks past its target.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from statistics import median

from gpumond.config.rules import PowerSlackRulesConfig
from gpumond.rules.detectors.features import RankFeatures
from gpumond.rules.energy.loop import JobLoop, advance_loop
from gpumond.rules.energy.slack import OperatingPoint, RankTime, Recommendation, job_recommendations
from gpumond.rules.types import GpuSample
from gpumond.types import Series

MAX_POINTS = 64  # limits remembered per GPU
BUSY = 0.5  # utilization at or above which a sample is the job working
LIMIT_BIN_W = 5.0

SLACK_METRICS = {
    "gpumond_power_slack_offer_watts": ("gauge", "The power limit offered to a GPU that waits on slower peers of its "
                                                 "job (agents apply it only when their policy.power_slack says so)."),
    "gpumond_power_slack_offering": ("gauge", "1 while the job's GPUs may be offered lower limits (its baseline "
                                              "step time learnt, no back-off holding)."),
    "gpumond_power_slack_backoffs_total": ("counter", "Times the job's offers were withdrawn because its step time "
                                                      "rose above its baseline by more than half the margin."),
}


def operating_point(samples: Sequence[GpuSample]) -> tuple[float, OperatingPoint] | None:
    """(limit W, the compute-phase point) from samples under one limit: the busiest quarter by power."""
    busy = [s for s in samples if s.up and s.values.get("utilization", 0.0) >= BUSY
            and "sm_clock_hz" in s.values and "power_w" in s.values and "power_limit_w" in s.values]
    if not busy:
        return None
    top = sorted(busy, key=lambda s: s.values["power_w"])[-max(1, len(busy) // 4):]
    return (busy[-1].values["power_limit_w"],
            OperatingPoint(sum(s.values["sm_clock_hz"] for s in top) / len(top),
                           sum(s.values["power_w"] for s in top) / len(top)))


class SlackPlanner:
    """`plan()` once per evaluation interval; `offers(node)` and `series()` from any thread."""

    def __init__(self, cfg: PowerSlackRulesConfig, features: Callable[[], Mapping[str, Sequence[RankFeatures]]],
                 window: Callable[[str, float], Sequence[GpuSample]], clock: Callable[[], float],
                 recent_s: float) -> None:
        self._cfg = cfg
        self._features = features
        self._window = window
        self._clock = clock
        self._recent_s = recent_s
        self._lock = threading.Lock()
        self._loops: dict[str, JobLoop] = {}
        self._points: dict[str, tuple[str, dict[float, OperatingPoint]]] = {}  # uuid → (job, limit → point)
        self._offers: dict[str, list[tuple[str, Recommendation]]] = {}  # node → [(job, rec)]
        self._since: dict[str, tuple[float, float]] = {}  # uuid → (its limit, since when it has had it)

    def plan(self) -> None:
        """Plan every job's offers. A plan that raises withdraws every offer (and raises): offers left standing
        would be renewed by the agents for as long as planning fails, even after their job ended."""
        try:
            self._plan()
        except BaseException:
            with self._lock:
                self._offers = {}
            raise

    def _plan(self) -> None:
        now = self._clock()
        loops: dict[str, JobLoop] = {}
        offers: dict[str, list[tuple[str, Recommendation]]] = {}
        held: set[str] = set()
        for job, feats in self._features().items():
            # A rank whose steps stopped (none ended within the recent window) makes the job get nothing: its
            # agents' leases end at their next answer.
            ranks = [f for f in feats if f.step_time_s and f.compute_frac is not None
                     and f.last_end is not None and now - f.last_end <= self._recent_s]
            if len(ranks) < 2 or len(ranks) != len(feats) or any(f.gpu_uuid.startswith("MIG-") for f in ranks):
                if job in self._loops:
                    loops[job] = self._loops[job]  # a back-off's hold outlasts a window without comm waits
                continue  # no compute share to judge by (comm wait not timed), one rank, or MIG slices
            step_s = median(f.step_time_s for f in ranks)  # type: ignore[misc]
            loop = loops[job] = advance_loop(self._loops.get(job, JobLoop()), step_s, now,
                                             margin=self._cfg.margin / 2, hold_s=self._cfg.hold_s)
            points, clocks, limits, nodes, settling = {}, {}, {}, {}, []
            for f in ranks:
                samples = self._window(f.gpu_uuid, now - self._recent_s)
                known = self._remember(job, f.gpu_uuid, samples)
                held.add(f.gpu_uuid)
                limit = samples[-1].values.get("power_limit_w") if samples else None
                if limit is None or not known:
                    continue
                nodes[f.gpu_uuid] = samples[-1].node
                was, since = self._since.get(f.gpu_uuid, (None, now))
                if was is None or abs(was - limit) >= 1.0:
                    self._since[f.gpu_uuid] = (limit, now)
                    since = now
                now_point = known.get(_bin(limit))
                if now_point is None or now - since < self._recent_s:
                    # The shares and points measured so far are not all of this limit yet (the detectors' medians
                    # span recent_s): keep the limit it has, and judge once they are. Stepping on stale
                    # measurements walks past the target.
                    if limit < max(known) - 1.0:
                        settling.append(Recommendation(f.gpu_uuid, limit, now_point.clock_hz if now_point else 0.0,
                                                       "hold", f.step_time_s * f.compute_frac,  # type: ignore[operator]
                                                       0.0))
                    continue
                points[f.gpu_uuid] = sorted(known.values(), key=lambda p: p.clock_hz)
                clocks[f.gpu_uuid], limits[f.gpu_uuid] = now_point.clock_hz, limit
            if not loop.offering:
                continue
            for r in settling:
                offers.setdefault(nodes[r.gpu_uuid], []).append((job, r))
            if not points:
                continue
            ceiling = {u: max(self._points[u][1]) for u in points}
            recs = job_recommendations(
                [RankTime(f.rank, f.gpu_uuid, f.step_time_s, f.compute_frac) for f in ranks  # type: ignore[arg-type]
                 if f.gpu_uuid in points], points, clocks, margin=self._cfg.margin,
                floor_w=dict.fromkeys(points, 1.0), ceiling_w=ceiling, probe_w=self._cfg.probe_w, limits=limits)
            for r in recs:
                offers.setdefault(nodes[r.gpu_uuid], []).append((job, r))
        with self._lock:
            self._loops = loops
            self._offers = offers
            self._points = {u: v for u, v in self._points.items() if u in held}
            self._since = {u: v for u, v in self._since.items() if u in held}

    def _remember(self, job: str, uuid: str, samples: Sequence[GpuSample]) -> dict[float, OperatingPoint]:
        """The GPU's points under this job, with the point under its current limit refreshed."""
        owner, known = self._points.get(uuid, (job, {}))
        if owner != job:
            known = {}  # another job's points say nothing of this one's load
        by_limit: dict[float, list[GpuSample]] = {}
        for s in samples:
            if (w := s.values.get("power_limit_w")) is not None:
                by_limit.setdefault(_bin(w), []).append(s)
        for limit, group in by_limit.items():
            got = operating_point(group)
            if got is not None:
                known[limit] = got[1]
        while len(known) > MAX_POINTS:
            known.pop(next(iter(known)))
        self._points[uuid] = (job, known)
        return known

    def steered(self) -> frozenset[str]:
        """The GPUs offered a limit now: each fetch must read them (telemetry.prometheus.detail_s otherwise reads
        them only every detail_s), or their recent window runs empty between detail fetches, their offer is
        withdrawn and their lease ends, to be stepped down again from the top at the next one."""
        with self._lock:
            return frozenset(r.gpu_uuid for recs in self._offers.values() for _, r in recs)

    def offers(self, node: str) -> list[dict[str, object]]:
        """This node's offers, as GET /api/v1/power/offers answers them."""
        with self._lock:
            return [{"gpu_uuid": r.gpu_uuid, "limit_w": r.limit_w, "job": job, "basis": r.basis,
                     "compute_s": round(r.compute_s, 6), "slowest_compute_s": round(r.slowest_compute_s, 6)}
                    for job, r in self._offers.get(node, [])]

    def series(self) -> list[Series]:
        with self._lock:
            out = [Series("gpumond_power_slack_offer_watts", (("job", job), ("node", node), ("gpu_uuid", r.gpu_uuid),
                                                              ("basis", r.basis)), r.limit_w)
                   for node, recs in sorted(self._offers.items()) for job, r in recs]
            for job, loop in sorted(self._loops.items()):
                out.append(Series("gpumond_power_slack_offering", (("job", job),), 1.0 if loop.offering else 0.0))
                out.append(Series("gpumond_power_slack_backoffs_total", (("job", job),), float(loop.backoffs)))
            return out


def _bin(watts: float) -> float:
    return round(watts / LIMIT_BIN_W) * LIMIT_BIN_W
