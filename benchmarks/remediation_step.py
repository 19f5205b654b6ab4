"""Fleet remediation at fleet scale: the cost of one remediation step's decision (pure parts) by fleet size.

One step = `agent_faults` over every firing agent alert, `by_node`, and `plan` (lifecycle, guard, breaker) over
every node the scheduler lists, with some nodes faulted and some held. The backend calls (scontrol, the
Kubernetes API) and the state file write are not included: they are per action, not per node, and bounded
by the guard. Pure Python on this machine; min / median / p90 of repeated steps.

    python benchmarks/remediation_step.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import machine_block, md_table, spread, write_result  # noqa: E402

from gpumond.config.remediation import RemediationConfig  # noqa: E402
from gpumond.rules.remediation.faults import agent_faults, by_node  # noqa: E402
from gpumond.rules.remediation.plan import NodeStatus, Record, State, plan  # noqa: E402
from gpumond.rules.types import AgentAlert  # noqa: E402

CFG = RemediationConfig(mode="enforce", backend="slurm",
                        guard={"max_nodes": 100, "max_pool_fraction": 0.1, "max_drains_per_hour": 100})


def fleet(nodes: int, faulted: int, held: int) -> tuple[dict[str, NodeStatus], list[AgentAlert], State]:
    """`nodes` in pools of 256, `faulted` with an XID 79 (plus 8 healthy alerts each on 5 % of nodes), `held`
    drained by gpumond and clear (in their hold-down)."""
    status, alerts, records = {}, [], {}
    for i in range(nodes):
        name, pool = f"gpu-{i:06d}", f"pool-{i // 256}"
        drained = i >= nodes - held
        status[name] = NodeStatus(name, pool, drained, drained, "gpumond: GPU 0 lost" if drained else "")
        if drained:
            records[name] = Record(name, pool, "gpumond: GPU 0 lost", ("gpu_lost",), 0.0, False, "drained",
                                   clear_since=1.0)
        if i < faulted:
            alerts.append(AgentAlert(name, {"alertname": "GpuXidCritical", "severity": "critical", "gpu": "0",
                                            "xid": "79"}))
        if i % 20 == 0:  # alerts that are not node faults still have to be read
            alerts += [AgentAlert(name, {"alertname": "GpuSwThermalSlowdown", "severity": "warning", "gpu": str(g)})
                       for g in range(8)]
    return status, alerts, State(records=records)


def step_s(status: dict[str, NodeStatus], alerts: list[AgentAlert], state: State) -> float:
    heard = frozenset(status)  # every agent answered in the latest telemetry (the usual case)
    start = time.perf_counter()
    faults = by_node(agent_faults(alerts), CFG.conditions)
    plan(state, faults, status, CFG, 10.0, heard=heard)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small fleets, few repeats (a smoke run; nothing written)")
    args = ap.parse_args()
    sizes = [256, 1024] if args.quick else [256, 1024, 4096, 16384, 65536]
    repeats = 3 if args.quick else 15
    rows = []
    for n in sizes:
        status, alerts, state = fleet(n, faulted=max(1, n // 100), held=min(50, n // 100))
        times = [step_s(status, alerts, state) for _ in range(repeats)]
        lo, med, p90 = spread(times)
        rows.append((f"{n:,}", f"{len(alerts):,}", f"{max(1, n // 100):,}", f"{min(50, n // 100):,}",
                     f"{lo * 1e3:.2f}", f"{med * 1e3:.2f}", f"{p90 * 1e3:.2f}"))
    table = md_table(("nodes", "agent alerts firing", "faulted nodes", "held nodes", "min ms", "median ms",
                      "p90 ms"), rows)
    text = (f"# Remediation step: decision cost by fleet size\n\n{machine_block()}\n\n{table}\n\n"
            "One step reads every firing agent alert and every scheduler node once (linear); at the default "
            "`remediation.interval_s` of 10 s the decision is a small share of the interval even at the "
            "largest size. `sinfo` / the node list from the API server are not included (one call per step).\n")
    if args.quick:
        print(text)
        return 0
    write_result("remediation_step", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
