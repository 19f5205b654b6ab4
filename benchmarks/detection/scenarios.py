"""The scenario catalogue: planted faults at every level the targets name, and fault-free negative controls."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpumond.config.rules import RulesConfig

from benchmarks.detection.cluster import Cluster, JobSpec
from benchmarks.detection.faults import THROTTLE_REASONS, Fault
from benchmarks.detection.noise import Noise

T0 = 1_700_000_000.0
# The rules service's default evaluation interval: every scenario is evaluated at it (one control at 2 s).
EVAL_S = float(RulesConfig.model_fields["evaluation_interval_s"].default)
WARMUP_S = 120.0  # windows full (60 s) and the job baseline learnt before any fault
OBSERVE_MAX_S = 300.0  # a fault is watched for at most this long after onset…
POST_S = 90.0  # …and this long after it clears (when it clears inside the run)
DURATIONS_S = (60.0, 300.0, 1800.0, 7200.0)  # a minute to hours
STEP_S = (1.0, 2.0, 4.0)  # base compute per step; the synchronous step is ~1.3× that

SLOWDOWNS = (1.03, 1.05, 1.10, 1.25, 1.5, 2.0)
NODE_SLOWDOWNS = (1.10, 1.25, 1.5)
WAIT_FRACS = (0.05, 0.10, 0.20, 0.40)
SUB_WAIT_FRACS = (0.02, 0.03)
OUTLIER_WAIT_FRACS = (0.4, 0.6)  # a starved rank inside a job whose every loader waits OUTLIER_BASE_WAIT…
OUTLIER_BASE_WAIT = 0.12  # …past job_min_cost_frac (8 %) until the outlier lengthens everyone's step. The
# ranks' waits then spread ~6–22 % (each loader at its own pace): a rank at 20 % is no outlier among them.
CAUSES = ("storage", "cpu", "remote")


@dataclass(frozen=True, slots=True)
class Scenario:
    """One simulated run: jobs, planted faults, noise, how long, and when the evaluator ticks."""

    name: str
    kind: str  # "fault" or "control"
    jobs: tuple[JobSpec, ...]
    faults: tuple[Fault, ...]
    noise: Noise
    seed: int
    duration_s: float
    eval_phase: float = 0.0  # first evaluation at T0 + eval_s − eval_phase … so onsets fall at random phases
    tags: dict = field(default_factory=dict)
    eval_s: float = EVAL_S  # the rules service's evaluation interval

    def build(self, **kw: object) -> Cluster:
        """The cluster, ready to advance."""
        return Cluster(self.jobs, self.faults, self.noise, seed=self.seed, t0=T0, **kw)  # type: ignore[arg-type]

    @property
    def nodes(self) -> int:
        """Nodes in use."""
        return sum(j.nodes for j in self.jobs)


def _rng(seed: int, *salt: int) -> np.random.Generator:
    return np.random.default_rng([seed, *salt])


def _fault_scenario(name: str, seed: int, salt: int, nodes: int, make) -> Scenario:  # noqa: ANN001
    rng = _rng(seed, salt)
    step = float(rng.choice(STEP_S))
    job = JobSpec("job-0", nodes, step_s=step)
    onset = T0 + WARMUP_S + rng.uniform(0.0, 10.0)
    dur = float(rng.choice(DURATIONS_S))
    fault = make(rng, job, onset, dur)
    watched = min(dur, OBSERVE_MAX_S)
    tail = POST_S if dur <= OBSERVE_MAX_S else 0.0
    if fault.kind == "hung_rank":
        watched, tail = 180.0, 0.0  # a hung job stays hung until someone restarts it
    return Scenario(name, "fault", (job,), (fault,), Noise(), seed * 1000 + salt,
                    WARMUP_S + 10.0 + watched + tail, eval_phase=rng.uniform(0.0, 10.0) * EVAL_S / 10.0,
                    tags={"step_s": step, "duration_s": dur})


def _where(rng: np.random.Generator, job: JobSpec) -> tuple[int, str, str]:
    rank = int(rng.integers(0, job.nodes * 8))
    node = job.first_node + rank // 8
    return rank, f"node-{node:05d}", f"GPU-{node:05d}-{rank % 8}"


def fault_scenarios(seed: int, nodes: int, slowdowns=SLOWDOWNS, node_slowdowns=NODE_SLOWDOWNS,  # noqa: ANN001
                    waits=WAIT_FRACS, sub_waits=SUB_WAIT_FRACS, hangs: int = 2,
                    outliers=OUTLIER_WAIT_FRACS) -> list[Scenario]:
    """Every planted fault class at every level, one job of `nodes` nodes per scenario."""
    out: list[Scenario] = []
    salt = 0

    def add(name: str, make) -> None:  # noqa: ANN001
        nonlocal salt
        salt += 1
        out.append(_fault_scenario(name, seed, salt, nodes, make))

    for s in slowdowns:
        for visible in (True, False):
            def slow_gpu(rng, job, onset, dur, s=s, visible=visible):  # noqa: ANN001, ANN202
                rank, node, uuid = _where(rng, job)
                return Fault("slow_gpu", job.name, onset, dur, rank=rank, node=node, gpu_uuid=uuid, slowdown=s,
                             visible=visible, reason=str(rng.choice(THROTTLE_REASONS)) if visible else None,
                             level=f"{s:.2f} {'throttled' if visible else 'silent'}")
            add(f"slow_gpu {s:.2f} {'throttled' if visible else 'silent'}", slow_gpu)
    for i, s in enumerate(node_slowdowns):
        for visible in (True, False):
            def slow_node(rng, job, onset, dur, s=s, visible=visible):  # noqa: ANN001, ANN202
                _, node, _ = _where(rng, job)
                return Fault("slow_node", job.name, onset, dur, node=node, slowdown=s, visible=visible,
                             reason="hw_power_brake" if visible else None,
                             level=f"{s:.2f} {'throttled' if visible else 'silent'}")
            add(f"slow_node {s:.2f} {'throttled' if visible else 'silent'}", slow_node)
    for i, f in enumerate(waits):
        def starved_rank(rng, job, onset, dur, f=f, i=i):  # noqa: ANN001, ANN202
            rank, node, uuid = _where(rng, job)
            return Fault("starved_rank", job.name, onset, dur, rank=rank, node=node, gpu_uuid=uuid, wait_frac=f,
                         cause=CAUSES[(i + seed) % 3], level=f"{f:.0%}")
        add(f"starved_rank {f:.0%}", starved_rank)

        def starved_node(rng, job, onset, dur, f=f, i=i):  # noqa: ANN001, ANN202
            _, node, _ = _where(rng, job)
            return Fault("starved_node", job.name, onset, dur, node=node, wait_frac=f,
                         cause=CAUSES[(i + seed + 1) % 2], level=f"{f:.0%}")
        add(f"starved_node {f:.0%}", starved_node)

        def starved_job(rng, job, onset, dur, f=f):  # noqa: ANN001, ANN202
            return Fault("starved_job", job.name, onset, dur, wait_frac=f, cause="remote", level=f"{f:.0%}")
        add(f"starved_job {f:.0%}", starved_job)
    for f in sub_waits:
        def starved_sub(rng, job, onset, dur, f=f):  # noqa: ANN001, ANN202
            rank, node, uuid = _where(rng, job)
            return Fault("starved_sub", job.name, onset, dur, rank=rank, node=node, gpu_uuid=uuid, wait_frac=f,
                         cause="storage", level=f"{f:.0%}")
        add(f"starved_sub {f:.0%}", starved_sub)
    for _ in range(hangs):
        def hung(rng, job, onset, dur):  # noqa: ANN001, ANN202
            rank, node, uuid = _where(rng, job)
            return Fault("hung_rank", job.name, onset, max(dur, 600.0), rank=rank, node=node, gpu_uuid=uuid,
                         level="hang")
        add("hung_rank", hung)
    # Last, so the scenarios above keep their seeds (salts) from before the starved outliers were added.
    for f in outliers:
        def starved_outlier(rng, job, onset, dur, f=f):  # noqa: ANN001, ANN202
            rank, node, uuid = _where(rng, job)
            return Fault("starved_outlier", job.name, onset, dur, rank=rank, node=node, gpu_uuid=uuid, wait_frac=f,
                         base_wait=OUTLIER_BASE_WAIT, cause=CAUSES[int(rng.integers(0, 2))], level=f"{f:.0%}")
        add(f"starved_outlier {f:.0%}", starved_outlier)
    return out


# Transient slowness at the rates and lengths the transient controls and the fleet-scale job run with: an
# episode on a rank every 2 minutes (median 0.5 s, log-sd 1, capped at 6 s) and one on a whole node every
# 30 minutes (median 2 s), each 1.15–1.6× slower (noise.py). Measured on real DDP (benchmarks/results/
# ddp_transients.md): on a busy host, runs of ≥ 3 steps ≥ 1.15× come thousands of times a rank-hour but
# last < 0.2 s; these are rarer and far longer, the harder case for looks that span seconds of steps.
TRANSIENTS = {"transient_rate_h": 30.0, "transient_node_rate_h": 2.0}
# At fleet scale every rank's transient stalls the whole job: at 30 an hour on each of 8,192 ranks a new one
# starts every 15 ms and every step waits for one, so the job would run ~1.5× slow on transients alone —
# not a fleet anyone runs. One per rank-hour (a new episode somewhere every 0.4 s, in most 2.6 s steps)
# and one per node every two hours is the upper end of a job that still looks healthy.
FLEET_TRANSIENTS = {"transient_rate_h": 1.0, "transient_node_rate_h": 0.5}

CONTROLS: dict[str, dict] = {
    "clean": {},
    "uneven stages, group reported": {"stages": 4, "stage_cost": (1.0, 1.0, 1.0, 1.25), "report_group": True},
    "uneven stages, no group": {"stages": 4, "stage_cost": (1.0, 1.0, 1.0, 1.25), "report_group": False},
    "uneven sequence lengths": {"noise": {"seq_sigma": 0.12, "long_seq_p": 0.02}},
    "checkpoint stalls": {"noise": {"ckpt_every_s": 300.0}},
    "GC pauses": {"noise": {"gc_p": 5e-3, "gc_median_s": 0.5}},
    "missing telemetry": {"noise": {"sample_miss_p": 0.06, "node_miss_p": 0.02}},
    # Healthy ranks slowed 1.15–1.6× for seconds, which once fired false stragglers: see TRANSIENTS. The second
    # runs 0.25 s steps evaluated every 2 s, where a handful of steps is a fraction of a second and evaluations
    # come fast.
    "transient slowdowns": {"noise": TRANSIENTS},
    "transient slowdowns, 0.25 s steps, 2 s evaluations": {"noise": TRANSIENTS, "step_s": 0.25},
}
# How a control runs when it is not the usual job of the benchmark's size, evaluated every EVAL_S.
CONTROL_RUNS: dict[str, dict] = {
    "transient slowdowns, 0.25 s steps, 2 s evaluations": {"eval_s": 2.0, "nodes": 16, "duration_s": 900.0},
}


def control_scenarios(seed: int, nodes: int, duration_s: float, names: tuple[str, ...] | None = None) -> list[Scenario]:
    """Fault-free runs: the everyday fleet and each negative control (workload imbalance is not a fault)."""
    out = []
    for i, (name, spec) in enumerate(CONTROLS.items()):
        if names is not None and name not in names:
            continue
        rng = _rng(seed, 500 + i)
        step = float(rng.choice(STEP_S))
        step = spec.get("step_s", step)
        noise = Noise().with_(**spec.get("noise", {}))
        how = CONTROL_RUNS.get(name, {})
        size = min(nodes, how.get("nodes", nodes))
        job = JobSpec("job-0", size, step_s=step, stages=spec.get("stages", 1),
                      stage_cost=spec.get("stage_cost", ()), report_group=spec.get("report_group", False))
        every = how.get("eval_s", EVAL_S)
        out.append(Scenario(f"control: {name}", "control", (job,), (), noise, seed * 1000 + 500 + i,
                            min(duration_s, how.get("duration_s", duration_s)), eval_phase=rng.uniform(0.0, every),
                            tags={"control": name, "step_s": step}, eval_s=every))
    return out


def big_control(seed: int, nodes: int, duration_s: float, transients: dict | None = None) -> Scenario:
    """A fault-free job at fleet scale (1,024 nodes in the full run) with the everyday noise and transients
    at the fleet's rate (FLEET_TRANSIENTS; the controls' stress rate with `transients=TRANSIENTS`)."""
    rng = _rng(seed, 900)
    job = JobSpec("job-big", nodes, step_s=2.0)
    knobs = FLEET_TRANSIENTS if transients is None else transients
    name = f"{nodes}-node job, transient slowdowns" + ("" if transients is None else " (stress rate)")
    return Scenario(f"control: {name}", "control", (job,), (), Noise().with_(**knobs), seed * 1000 + 900,
                    duration_s, eval_phase=rng.uniform(0.0, EVAL_S), tags={"control": name, "step_s": 2.0})
