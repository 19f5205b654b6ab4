"""What power-slack leases cost the agent's policy cycle when no lease applies: the policy engine's cycle over
8 simulated H100s (the real pynvml over the simulated NVML, the real NvmlSession and PolicyEngine), without a
lease source, and with one that holds no lease (what an agent with `power_slack.rules_url` set runs while the
rules service offers nothing). Alternating rounds in one process; the ratio of medians is the result.

    python benchmarks/energy_cycle.py            # ~20 s
    python benchmarks/energy_cycle.py --quick    # a few seconds (smoke test)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench  # noqa: E402
from gpumond.state.audit import AuditLog  # noqa: E402
from gpumond.agent.policy.engine import PolicyEngine  # noqa: E402
from gpumond.agent.policy.lease import Leases  # noqa: E402
from gpumond.agent.policy.state_file import StateFile  # noqa: E402
from gpumond.agent.policy.view import build_views  # noqa: E402
from gpumond.config import PolicyConfig  # noqa: E402
from gpumond.nvml.session import NvmlSession  # noqa: E402
from gpumond.nvml.sim import ManualClock, SimulatedNvml  # noqa: E402

NAME = "energy_cycle"
GPUS = 8


def engine_cycles(leases: bool, cycles: int, tmp: Path) -> list[float]:
    """Seconds per policy cycle, for `cycles` cycles on one simulated node."""
    clock = ManualClock()
    sim = SimulatedNvml(gpu_count=GPUS, node="bench-node", clock=clock)
    session = NvmlSession(install=sim.install, clock=clock.now)
    session.open()
    empty = Leases()
    policy = PolicyConfig.model_validate({"mode": "enforce", "power_slack": {"mode": "enforce"}})
    engine = PolicyEngine(policy, session, node="bench-node", state_file=StateFile(tmp / f"s-{leases}.json"),
                          audit=AuditLog(tmp / f"a-{leases}.jsonl"), clock=clock.now,
                          leases=(lambda: empty) if leases else None)
    slow = session.read("slow")
    views = build_views(session.read("fast"), slow)
    out = []
    try:
        for _ in range(cycles):
            clock.advance(1)
            t0 = time.perf_counter()
            engine.cycle(views, {})
            out.append(time.perf_counter() - t0)
    finally:
        session.close()
        sim.uninstall()
    return out


def main() -> int:
    args = _bench.parser(__doc__ or "", "fewer cycles").parse_args()
    rounds, cycles = (3, 200) if args.quick else (10, 1000)
    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as d:
        for r in range(rounds):
            for leases in ((False, True) if r % 2 == 0 else (True, False)):
                times[leases] += engine_cycles(leases, cycles, Path(d))
    base, with_ = statistics.median(times[False]), statistics.median(times[True])
    table = _bench.md_table(("policy cycle, 8 GPUs", "median", "p90", "cycles"), [
        (label, _bench.fmt_us(statistics.median(ts)), _bench.fmt_us(_bench.quantile(ts, 0.9)), len(ts))
        for label, ts in (("no lease source", times[False]), ("a lease source holding no lease", times[True]))])
    ratio = f"Ratio of medians (with / without): {with_ / base:.3f}."
    print(table + "\n\n" + ratio)
    _bench.report(NAME, "# Policy cycle cost of power-slack leases when none applies",
                  {"command": "python benchmarks/energy_cycle.py" + (" --quick" if args.quick else "")},
                  table, ratio, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
