"""Power slack end to end in the real daemons: a `gpumond rules` process, a `gpumond agent` process over 4
simulated H100s (one degraded: its clock × 0.8), and a simulated 4-rank synchronous job pushing through the real
job SDK, whose compute time follows each GPU's SM clock as the agent reports it (the dashboards test's
`follow_clocks`). The agent runs `policy.mode: enforce` with `power_slack: {mode: enforce}`; the rules service
offers as configured (margin 4 %: a wall-clock job on a busy machine jitters by about 1 %).

Every 5 s it records the GPUs' limits, the offers, the job's step time and a waiting rank's compute share.
What it shows: the waiting GPUs walk down under the guard, each step held for the detectors' 60 s window,
the degraded GPU (the one the job waits for) is never offered anything, the step time does not move, and no
back-off fires. Energy is not compared here (the simulated GPUs' power does not follow the job's waits; see
energy_slack.py for energy per step).

    python benchmarks/energy_daemons.py            # ~8 min
    python benchmarks/energy_daemons.py --quick    # ~100 s: the first step only
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench  # noqa: E402
import yaml  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gpumond.demo.job import ClockFactors, SimulatedJob  # noqa: E402
from gpumond.demo.watch import clock_factors  # noqa: E402
from gpumond.nvml.sim.gpu import gpu_uuid  # noqa: E402

NAME = "energy_daemons"
NODE = "slack-node"
TOKEN = "t" * 32
STEP_S = 0.2


def get(url: str) -> str:
    assert url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def series(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def write_yaml(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def metrics(url: str) -> dict[str, list]:
    """A daemon's /metrics as family name → samples."""
    return {f.name: f.samples for f in text_string_to_metric_families(get(url + "/metrics"))}


def follow_clocks(node: str, agent_url: str, factors: ClockFactors, stop: threading.Event) -> None:
    """A thread that slows each simulated rank by its GPU's clock, as the demo does (gpumond.demo.watch)."""

    def run() -> None:
        while not stop.wait(0.5):
            try:
                clock_factors(node, metrics(agent_url), factors)
            except OSError:  # a lost scrape only delays the next update
                continue

    threading.Thread(target=run, name="clocks", daemon=True).start()


def main() -> int:
    args = _bench.parser(__doc__ or "", "the first step only").parse_args()
    seconds = 100 if args.quick else 480
    work = Path(tempfile.mkdtemp(prefix="gpumond-energy-daemons-"))
    rport, aport = _bench.free_port(), _bench.free_port()
    rules_cfg = write_yaml(work / "rules.yaml", {
        "listen": f"127.0.0.1:{rport}", "tokens": [TOKEN], "evaluation_interval_s": 1, "state_dir": str(work / "r"),
        "telemetry": {"scrape": {"targets": [f"127.0.0.1:{aport}"], "interval_s": 1}},
        "power_slack": {"margin": 0.04}})
    agent_cfg = write_yaml(work / "agent.yaml", {
        "state_dir": str(work / "a"), "node_name": NODE, "sampling": {"fast_interval_s": 1, "slow_interval_s": 5},
        "policy": {"mode": "enforce", "thermal": {"enabled": False},
                   "power_slack": {"mode": "enforce", "rules_url": f"http://127.0.0.1:{rport}", "interval_s": 2,
                                   "lease_s": 10, "max_gpus_per_interval": 4, "max_step_w": 50}}})
    scenario = write_yaml(work / "slow.yaml", {"faults": [{"gpu": 3, "kind": "slow", "factor": 0.8,
                                                                    "at_s": 0}]})
    agent = _bench.Proc("agent", [sys.executable, "-m", "gpumond.cli", "agent", "--sim", "4", "--config", agent_cfg,
                                  "--sim-scenario", scenario, "--listen", f"127.0.0.1:{aport}"], work / "agent.log")
    agent_url = f"http://127.0.0.1:{aport}"
    rules = _bench.Proc("rules", [sys.executable, "-m", "gpumond.cli", "rules", "--config", str(rules_cfg)],
                        work / "rules.log", env={**os.environ, "PYTHONPATH": _bench.pythonpath()})
    rows = []
    stop = threading.Event()
    job = None
    try:
        agent.start().wait_http(agent_url + "/healthz")
        rules.start().wait_http(f"http://127.0.0.1:{rport}/readyz")
        factors = ClockFactors()
        follow_clocks(NODE, agent_url, factors, stop)
        job = SimulatedJob(job="slack", ranks=[(NODE, i, gpu_uuid(NODE, i)) for i in range(4)],
                           endpoint=f"http://127.0.0.1:{rport}", token=TOKEN, step_s=STEP_S, clock_factors=factors,
                           data_wait=lambda rank: 0.0)
        job.start()
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            time.sleep(10)
            agent_text = get(agent_url + "/metrics")
            limits = [series(agent_text, "gpumond_gpu_power_limit_watts", gpu=str(i)) for i in range(4)]
            offers = json.loads(get(f"http://127.0.0.1:{rport}/api/v1/power/offers?node={NODE}"))["offers"]
            text = get(f"http://127.0.0.1:{rport}/metrics")
            step = series(text, "gpumond_job_rank_step_seconds", rank="0")
            share = series(text, "gpumond_job_rank_compute_ratio", rank="0")
            backoffs = series(text, "gpumond_power_slack_backoffs_total", job="slack")
            rows.append((round(time.monotonic() - start), *(f"{w:.0f}" if w else "-" for w in limits),
                         ", ".join(sorted({o["basis"] for o in offers})) or "-",
                         f"{step * 1e3:.2f}" if step else "-", f"{share:.3f}" if share else "-",
                         "-" if backoffs is None else int(backoffs)))
            print(rows[-1], flush=True)
    finally:
        stop.set()
        if job is not None:
            job.stop()
        rules.terminate()
        agent.terminate()  # SIGTERM: the agent restores the limits it set
        shutil.rmtree(work, ignore_errors=True)
    table = _bench.md_table(("s", "GPU 0 W", "GPU 1 W", "GPU 2 W", "GPU 3 (degraded) W", "offers", "step ms (rank 0)",
                             "rank 0 compute share", "back-offs"), rows)
    print(table)
    _bench.report(NAME, "# Power slack end to end: rules service, agent and a simulated job",
                  {"command": "python benchmarks/energy_daemons.py" + (" --quick" if args.quick else "")}, table,
                  "The job waits on GPU 3 (clock × 0.8); ranks 0–2 compute about 80 % of each step and wait the rest. "
                  f"Target: a waiting rank's compute share rises towards 0.96 (margin 4 %) at an unchanged step "
                  f"time of {STEP_S / 0.8 * 1e3:.0f} ms.", quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
