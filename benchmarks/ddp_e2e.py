"""End to end on real training: simulated GPUs, the rules service scraping them, a real DDP job pushing.

One case = `gpumond agent --sim 4` (the ranks' GPUs, all healthy: the faults are silent to telemetry),
`gpumond rules` scraping it every second and evaluating every second, and benchmarks/ddp_job.py under
torchrun (4 ranks, gloo on CPU) instrumented with gpumond.job.torch and pushing to the service. A planted
fault must come out as its finding on its rank; a fault-free run must give none. Latency is counted from
the first training step (after torch's start-up) to the finding's first sight as pending and as firing.

    python benchmarks/ddp_e2e.py [--cases clean,slow,starved_rank,starved_job] [--duration 60] [--evaluation 1]

tests/integration/test_job_torch_e2e.py runs the cheapest cases of the same harness.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # imported by tests/integration/test_job_torch_e2e.py as well as run as a script
    sys.path.append(str(HERE))
import _bench  # noqa: E402

from gpumond.config.rules import RulesConfig  # noqa: E402

TOKEN = "e2e-token-0123456789abcdef"
NODE = "e2e-node-0"
JOB = "ddp-e2e"
WORLD = 4
EVALUATION_S = float(RulesConfig.model_fields["evaluation_interval_s"].default)  # the service's default
JOB_ARGS = ["--batch", "32", "--dim", "64", "--width", "256", "--depth", "4", "--device-ms", "30",
            "--bucket-mb", "0.1"]
Expected = tuple[tuple[str, int | None], ...]  # (kind, rank or None) of every finding a case must give
# case → (the job's fault flags, the findings expected)
CASES: dict[str, tuple[list[str], Expected]] = {
    "clean": ([], ()),
    "slow": (["--slow-rank", "2", "--slow-factor", "1.5"], (("straggler", 2),)),
    "slow_1.25": (["--slow-rank", "2", "--slow-factor", "1.25"], (("straggler", 2),)),
    "starved_rank": (["--starve-rank", "1", "--starve-s", "0.01"], (("io_starved_rank", 1),)),
    "starved_job": (["--starve-all", "--starve-s", "0.01"], (("io_starved_job", None),)),
    # Every loader a little slow, rank 1's far slower (it waits most of its step); the service once reported only
    # the job here. The rank must be named; the job finding beside it is allowed (whether the others still wait
    # ≥ 8 % of the step it lengthens is timing), not required.
    "outlier_in_starved_job": (["--starve-all", "--starve-s", "0.015", "--starve-rank", "1", "--starve-rank-s", "0.08"],
                               (("io_starved_rank", 1),)),
    # Both rank faults in one job (the CI test's case): the starved rank waits least too, but its data wait
    # accounts for it, so only rank 2 is a straggler.
    "slow_and_starved": (["--slow-rank", "2", "--slow-factor", "1.5", "--starve-rank", "1", "--starve-s", "0.01"],
                         (("straggler", 2), ("io_starved_rank", 1))),
}


@dataclass
class Outcome:
    """What the service said during one case, times in seconds from the job's first training step."""

    case: str
    expected: Expected
    seen: dict[tuple[str, int | None, str], float] = field(default_factory=dict)  # (kind, rank, state) → first t
    evidence: dict[tuple[str, int | None, str], object] = field(default_factory=dict)  # at first sight
    started: float | None = None  # seconds from launch to the first step (torchrun + torch import)
    ran_s: float = 0.0

    def first(self, kind: str, rank: int | None, state: str) -> float | None:
        return self.seen.get((kind, rank, state))

    def unexpected(self) -> list[tuple[str, int | None, str]]:
        return sorted((k for k in self.seen if k[:2] not in self.expected), key=str)

    def all_fired(self) -> bool:
        return all((kind, rank, "firing") in self.seen for kind, rank in self.expected)


def run_case(case: str, workdir: Path, *, duration_s: float = 60.0, settle_s: float = 10.0,
             evaluation_s: float = EVALUATION_S, world: int = WORLD, agent: tuple[str, list[str]] | None = None,
             node: str = NODE, job_args: list[str] | None = None,
             planted: tuple[list[str], Expected] | None = None, job_env: dict[str, str] | None = None,
             relay: bool = False) -> Outcome:
    """Run one case; stop early once every expected finding fires and `settle_s` more has passed.

    Without `agent` a `gpumond agent --sim <world>` is started for the ranks' GPUs (one each); with
    `agent=(host:port, GPU UUID of each rank)` the rules service scrapes that running agent instead (the field
    check's agent on a real GPU, every rank on the one GPU). `job_args` replace JOB_ARGS (the fault flags of the
    case are added to them); `planted` gives the case's (fault flags, expected findings) instead of CASES;
    `job_env` is added to the job's environment. `relay`: the ranks push through the simulated node's agent
    (its relay, pushing every 2 s, its default) instead of to the service directly."""
    fault, expected = planted if planted is not None else CASES[case]
    workdir.mkdir(parents=True, exist_ok=True)
    out = Outcome(case, expected)
    procs: list[_bench.Proc] = []
    try:
        rules_port = _bench.free_port()
        route = {"GPUMOND_ENDPOINT": f"http://127.0.0.1:{rules_port}", "GPUMOND_RELAY": "off"}
        relay_config = {}
        if relay and agent is not None:
            raise ValueError("relay=True runs the relay in the simulated agent this case starts; give no agent")
        if relay:
            relay_port = _bench.free_port()
            relay_config = {"relay": {"upstream": route["GPUMOND_ENDPOINT"], "listen": f"127.0.0.1:{relay_port}"}}
            route = {"GPUMOND_RELAY": f"http://127.0.0.1:{relay_port}"}  # no endpoint: every push via the relay
        if agent is None:
            agent_port = _bench.free_port()
            (workdir / "agent.yaml").write_text(json.dumps({"state_dir": str(workdir / "agent-state"),
                                                            "policy": {"mode": "off"}, **relay_config}))
            sim = _bench.Proc("agent", [sys.executable, "-m", "gpumond.cli", "agent", "--sim", str(world),
                                        "--node-name", node, "--listen", f"127.0.0.1:{agent_port}",
                                        "--config", str(workdir / "agent.yaml")], workdir / "agent.log").start()
            procs.append(sim)
            metrics = _bench.wait_for(lambda: _bench.fetch(f"http://127.0.0.1:{agent_port}/metrics").decode(), 60,
                                      "agent /metrics", sim)
            uuids = gpu_uuids_of(metrics)
            agent = (f"127.0.0.1:{agent_port}", [uuids[i] for i in range(world)])
        target, rank_uuids = agent
        (workdir / "rules.yaml").write_text(json.dumps({
            "listen": f"127.0.0.1:{rules_port}", "tokens": [TOKEN], "evaluation_interval_s": evaluation_s,
            "window_s": 120,
            "state_dir": str(workdir / "rules-state"),
            "telemetry": {"scrape": {"targets": [target], "interval_s": 1}}}))
        rules = _bench.Proc("rules", [sys.executable, "-m", "gpumond.cli", "rules", "--config",
                                      str(workdir / "rules.yaml")], workdir / "rules.log").start()
        procs.append(rules)
        gpu_uuids = ",".join(rank_uuids)
        base = f"http://127.0.0.1:{rules_port}"
        rules.wait_http(base + "/healthz", 60)
        launched = time.monotonic()
        job = _bench.Proc("job", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                  f"--nproc-per-node={world}", str(HERE / "ddp_job.py"), "--duration-s",
                                  str(duration_s + 60), "--gpu-uuids", gpu_uuids,
                                  *(JOB_ARGS if job_args is None else job_args), *fault],
                          workdir / "job.log",
                          env={**route, "GPUMOND_TOKEN": TOKEN, "GPUMOND_JOB_ID": JOB,
                               "GPUMOND_NODE": node, "OMP_NUM_THREADS": "1", **(job_env or {})}).start()
        procs.append(job)
        started_at = _bench.wait_for(lambda: re.search(rb"training started at ([\d.]+)", job.log.read_bytes()),
                                     120, "the job's first step", job)
        t0 = float(started_at.group(1))
        out.started = t0 - (time.time() - (time.monotonic() - launched))
        stop_at = t0 + duration_s
        while time.time() < stop_at:
            if not job.alive:
                raise RuntimeError(f"the job exited ({job.returncode}) early\n{job.tail()}")
            try:
                findings = _bench.get_json(base + "/api/v1/findings", timeout_s=2.0)["findings"]
            except (OSError, ValueError):
                findings = []
            now = time.time() - t0
            for f in findings:
                if f.get("job") != JOB:
                    continue
                key = (f["kind"], f.get("rank"), f["state"])
                if key not in out.seen:
                    out.seen[key] = round(now, 1)
                    out.evidence[key] = f.get("evidence", {})
            if expected and out.all_fired():
                last = max(out.seen[(kind, rank, "firing")] for kind, rank in expected)
                stop_at = min(stop_at, t0 + last + settle_s)
            time.sleep(0.5)
        out.ran_s = round(time.time() - t0, 1)
        return out
    finally:
        for p in reversed(procs):
            p.terminate(15)


def gpu_uuids_of(metrics: str) -> dict[int, str]:
    """GPU index → UUID from an agent's gpumond_gpu_info series (label order is the exposition's; either is read)."""
    found = {int(g): u for g, u in re.findall(r'gpumond_gpu_info\{[^}]*gpu="(\d+)"[^}]*uuid="(GPU-[^"]+)"', metrics)}
    found.update({int(g): u for u, g in re.findall(r'gpumond_gpu_info\{[^}]*uuid="(GPU-[^"]+)"[^}]*gpu="(\d+)"',
                                                   metrics)})
    return found


ALL_CASES = "clean,slow,slow_1.25,starved_rank,starved_job,outlier_in_starved_job,slow_and_starved"


def main() -> int:
    # Its findings prove nothing (tests/integration/test_job_torch_e2e.py holds those): it runs the harness.
    ap = _bench.parser(__doc__, "the clean case, 2 ranks, 4 s of training, evaluation every 1 s")
    ap.add_argument("--cases", help="default " + ALL_CASES)
    ap.add_argument("--duration", type=float, help="seconds of training per case at most (default 60)")
    ap.add_argument("--evaluation", type=float,
                    help=f"the rules service's evaluation_interval_s (default {EVALUATION_S:g}, the service's)")
    a = ap.parse_args()
    cases = a.cases or ("clean" if a.quick else ALL_CASES)
    duration = a.duration or (4.0 if a.quick else 60.0)
    evaluation = a.evaluation or (1.0 if a.quick else EVALUATION_S)
    world = 2 if a.quick else WORLD
    rows = []
    for case in cases.split(","):
        print(f"… {case}", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            o = run_case(case, Path(tmp), duration_s=duration, evaluation_s=evaluation, world=world)
        other = ", ".join(f"{k} r{r} {s} at {o.seen[(k, r, s)]} s" for k, r, s in o.unexpected()) or "none"
        for kind, rank in o.expected or ((None, None),):
            want = "none" if kind is None else f"{kind} on {'the job' if rank is None else f'rank {rank}'}"
            pend = "—" if kind is None else o.first(kind, rank, "pending")
            fire = "—" if kind is None else o.first(kind, rank, "firing")
            rows.append([case, want, "not seen" if pend is None else pend, "not found" if fire is None else fire,
                         other, o.ran_s, round(o.started or 0, 1)])
    _bench.report(
        "ddp_e2e" if evaluation == EVALUATION_S or a.quick else f"ddp_e2e_eval{evaluation:g}s",
        "# End to end on real DDP: planted faults → findings",
        {"torch": _bench._version("torch"),
         "setup": f"`gpumond agent --sim {world}` + `gpumond rules` (scrape every 1 s, "
                  f"evaluation every {evaluation:g} s, default detectors) + torchrun {world} ranks of "
                  f"benchmarks/ddp_job.py {' '.join(JOB_ARGS)} pushing every 1 s",
         "note": "a shared 2-core VM with other work running"},
        _bench.md_table(["case", "expected", "pending after s", "firing after s", "any other finding",
                         "ran s", "start-up s"], rows),
        "Times from the job's first training step. A case stops 10 s after its finding fires.",
        quick=a.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
