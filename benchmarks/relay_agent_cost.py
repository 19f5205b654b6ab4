"""What relaying its node's ranks costs the agent: RSS and CPU of `gpumond agent --sim 8` with 8 ranks stepping
twice a second pushing through its relay, against the same agent and ranks pushing to the rules service directly.

Both phases run the same processes on the same machine: a real `gpumond rules`, the agent, and 8 SDK processes
(gpumond.job, the SDK's default push interval) each recording 2 steps/s. The agent's CPU time (utime + stime)
over the measured span and its RSS at the end are compared; the difference is the relay's cost.

    python benchmarks/relay_agent_cost.py            # ~5 min
    python benchmarks/relay_agent_cost.py --quick    # ~30 s (smoke test)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench  # noqa: E402

TOKEN = "relay-agent-bench-token-0123456789"
RANKS = 8
RATE = 2.0  # steps per second per rank
# One training rank: records RATE steps/s until killed (the SDK's own defaults otherwise).
RANK = """
import sys, time
from gpumond import job
rep = job.init(rank=int(sys.argv[1]), world_size=int(sys.argv[2]), handle_sigterm=False)
start, n = time.monotonic(), 0
while True:
    with rep.step():
        time.sleep(0.01)
    n += 1
    time.sleep(max(0.0, start + n / float(sys.argv[3]) - time.monotonic()))
"""


def run_phase(work: Path, rules_url: str, relay: bool, warm_s: float, span_s: float) -> dict[str, float]:
    """Start the agent and the ranks, let them settle, then measure the agent over `span_s`."""
    work.mkdir(parents=True, exist_ok=True)
    agent_port, relay_port = _bench.free_port(), _bench.free_port()
    config = {"state_dir": str(work / "state"), "policy": {"mode": "off"}}
    if relay:
        config["relay"] = {"upstream": rules_url, "listen": f"127.0.0.1:{relay_port}"}
    (work / "agent.json").write_text(json.dumps(config))
    procs = []
    try:
        agent = _bench.Proc("agent", [sys.executable, "-m", "gpumond.cli", "agent", "--sim", "8", "--config",
                                      str(work / "agent.json"), "--listen", f"127.0.0.1:{agent_port}"],
                            work / "agent.log").start()
        procs.append(agent)
        _bench.wait_http(f"http://127.0.0.1:{agent_port}/healthz", 60, agent.proc)
        route = ({"GPUMOND_RELAY": f"http://127.0.0.1:{relay_port}"} if relay else
                 {"GPUMOND_RELAY": "off", "GPUMOND_ENDPOINT": rules_url})
        for rank in range(RANKS):
            env = {**route, "GPUMOND_TOKEN": TOKEN, "GPUMOND_JOB_ID": "bench-job",
                   "GPUMOND_GPU_UUID": f"GPU-00000000-0000-4000-8000-{rank:012x}"}
            procs.append(_bench.Proc(f"rank{rank}", [sys.executable, "-c", RANK, str(rank), str(RANKS), str(RATE)],
                                     work / f"rank{rank}.log", env=env).start())
        time.sleep(warm_s)
        cpu0, t0 = _bench.proc_cpu_s(agent.pid), time.monotonic()
        time.sleep(span_s)
        cpu = _bench.proc_cpu_s(agent.pid) - cpu0
        wall = time.monotonic() - t0
        rss = _bench.proc_status_kib(agent.pid, "VmRSS") / 1024
        metrics = _bench.fetch(f"http://127.0.0.1:{agent_port}/metrics").decode()
        forwarded = next((float(line.split()[-1]) for line in metrics.splitlines()
                          if line.startswith("gpumond_relay_steps_forwarded_total ")), 0.0)
        return {"cpu_pct": 100 * cpu / wall, "rss_mib": rss, "forwarded": forwarded, "wall": wall}
    finally:
        for p in reversed(procs):
            p.terminate(15)


def main() -> None:
    ap = _bench.parser(__doc__, "10 s warm-up, 15 s measured per phase, one repeat")
    ap.add_argument("--warm", type=float, default=15.0, help="seconds before measuring (default 15)")
    ap.add_argument("--span", type=float, default=45.0, help="seconds measured per phase (default 45)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    if args.quick:
        args.warm, args.span, args.repeats = 10.0, 15.0, 1
    work = Path(tempfile.mkdtemp(prefix="relay-agent-"))
    rules, base = _bench.start_rules(work, [TOKEN])
    out: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    try:
        for i in range(args.repeats):
            for relay in (False, True):
                out[relay].append(run_phase(work / f"{'relay' if relay else 'direct'}-{i}", base, relay,
                                            args.warm, args.span))
    finally:
        rules.terminate()
    rows = []
    for relay, runs in out.items():
        for i, r in enumerate(runs):
            rows.append(("through the agent's relay" if relay else "directly (relay off)", i + 1,
                         f"{r['cpu_pct']:.2f} %", f"{r['rss_mib']:.1f}", f"{r['forwarded']:.0f}"))
    cpu = {k: sum(r["cpu_pct"] for r in v) / len(v) for k, v in out.items()}
    rss = {k: sum(r["rss_mib"] for r in v) / len(v) for k, v in out.items()}
    _bench.report(
        "relay_agent_cost", "# The agent's cost of relaying 8 ranks × 2 steps/s",
        {"command": " ".join(sys.argv), "setup": f"`gpumond agent --sim 8` (policy off), {RANKS} SDK processes "
         f"recording {RATE:g} steps/s each (push interval 5 s, the SDK's default), a real `gpumond rules`; "
         f"{args.warm:g} s settle, then {args.span:g} s measured per phase; phases alternate, {args.repeats}× each"},
        _bench.md_table(("ranks push", "run", "agent CPU (% of a core)", "agent RSS MiB", "steps relayed at the end"),
                        rows),
        f"**The relay costs the agent {cpu[True] - cpu[False]:+.2f} % of a core and {rss[True] - rss[False]:+.1f} MiB "
        "of RSS** (means of the runs above; targets +2 % and +16 MiB). RSS includes what the relay imports once "
        "(its push checks: pydantic models, numpy decoding, the httpx client) and its buffer, which holds a few "
        "seconds of steps while the rules service answers.",
        quick=args.quick)


if __name__ == "__main__":
    main()
