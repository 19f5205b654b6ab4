"""`gpumond health-check`: Slurm's HealthCheckProgram for a GPU node, as LBNL NHC is.

Reads this node's agent (/metrics on loopback), turns what it has firing into node faults with the same rules
as the rules service (gpumond.rules.remediation), and drains or resumes this node through scontrol, behind
the same guard: nodes that sinfo shows drained by gpumond anywhere count against guard.max_nodes and
max_pool_fraction, and a node a person drained is never touched. State (hold-down, the node's record) is kept
in the agent's state directory between runs. Dry run unless --mode enforce (or GPUMOND_HEALTH_CHECK_MODE).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

COMMAND = "health-check"
MODE_ENV = "GPUMOND_HEALTH_CHECK_MODE"
AUDIT_FILE = "health-check-audit.jsonl"


def add_parser(sub: Any) -> None:
    """Register `gpumond health-check` on the CLI's subparsers."""
    h = sub.add_parser(
        COMMAND, help="Slurm HealthCheckProgram: drain or resume this node from its agent's alerts",
        description=("Check this node's GPUs through its gpumond agent and drain this node in Slurm when a GPU is\n"
                     "lost, reports an XID that needs a reset, or failed a row remap; resume it once every\n"
                     "condition has been clear for the hold-down. Only a node whose reason gpumond wrote is ever\n"
                     "resumed. Dry run (prints what it would do) unless --mode enforce or "
                     f"{MODE_ENV}=enforce.\n\n"
                     "slurm.conf (HealthCheckProgram takes no arguments; a two-line wrapper sets the mode):\n"
                     "  HealthCheckProgram=/usr/local/sbin/gpumond-health-check\n"
                     "  HealthCheckInterval=60\n"
                     "  # /usr/local/sbin/gpumond-health-check:\n"
                     "  #   #!/bin/sh\n"
                     "  #   exec gpumond health-check --mode enforce"),
        epilog=("examples:\n"
                "  gpumond health-check                       # dry run: what it would do to this node\n"
                "  gpumond health-check --mode enforce --hold-down-s 600\n"
                "\nexit status: 0 healthy, or held (dry run: would be held) for its faults; 1 faulty and not held\n"
                "by this check (refused, breaker open, drained by someone else), a scheduler call failed, or the\n"
                "agent unreachable; 2 bad flags\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    h.set_defaults(run=run)
    h.add_argument("--agent", default="http://127.0.0.1:9480", help="this node's agent (default %(default)s)")
    h.add_argument("--node", default=None,
                   help="this node's Slurm name (default: $SLURMD_NODENAME, else the short host name)")
    h.add_argument("--mode", choices=["dry_run", "enforce"], default=None,
                   help=f"dry_run (default, or ${MODE_ENV}) or enforce")
    h.add_argument("--state-dir", type=Path, default=Path("/var/lib/gpumond"),
                   help="where the hold-down and audit log are kept (default %(default)s, the agent's)")
    h.add_argument("--hold-down-s", type=float, default=900.0,
                   help="every condition clear this long before resuming (default %(default)g)")
    h.add_argument("--max-nodes", type=int, default=2,
                   help="refuse to drain when gpumond already holds this many nodes (default %(default)s)")
    h.add_argument("--max-pool-fraction", type=float, default=0.1,
                   help="…or this share of the node's partition (default %(default)g; one node always may)")


def run(args: argparse.Namespace) -> int:
    """Run one health check."""
    from pydantic import ValidationError

    from gpumond.config.remediation import RemediationConfig
    from gpumond.rules.remediation.backends import BackendError
    from gpumond.rules.remediation.backends.slurm import SlurmBackend
    from gpumond.rules.remediation.remediator import Remediator

    mode = args.mode or os.environ.get(MODE_ENV, "dry_run")
    node = args.node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    try:
        cfg = RemediationConfig(mode=mode, backend="slurm", hold_down_s=args.hold_down_s, interval_s=60,
                                conditions=("gpu_lost", "xid_critical", "row_remap_failed"),
                                guard={"max_nodes": args.max_nodes, "max_pool_fraction": args.max_pool_fraction})
    except ValidationError as e:
        err = e.errors()[0]
        print(f"gpumond health-check: {'.'.join(map(str, err['loc']))}: {err['msg']}", file=sys.stderr)
        return 2
    reading = _read_agent(args.agent, node)
    if isinstance(reading, str):
        print(f"gpumond health-check: {node}: cannot read the agent at {args.agent}: {reading}; node left as it is",
              file=sys.stderr)
        return 1
    from gpumond.state.audit import AuditLog
    from gpumond.rules.types import TelemetryBatch

    backend = SlurmBackend(cfg.slurm)
    try:
        if node not in backend.nodes():
            print(f"gpumond health-check: {node} is not a Slurm node (set --node or SLURMD_NODENAME)", file=sys.stderr)
            return 2
    except BackendError as e:  # typically not a Slurm node, or one that cannot reach its controller
        print(f"gpumond health-check: {e} (it runs on a Slurm node, as its HealthCheckProgram: even a dry run "
              "asks sinfo for the node and its partition; SLURM_CONF selects the cluster)", file=sys.stderr)
        return 1
    state_dir = args.state_dir / "health-check"
    state_dir.mkdir(parents=True, exist_ok=True)
    remediator = Remediator(cfg, backend=backend, state_dir=state_dir, audit=AuditLog(state_dir / AUDIT_FILE),
                            scope={node})
    try:
        remediator.observe(TelemetryBatch(t=time.time(), gpus=reading.gpus, alerts=reading.alerts))
        actions = [a for a in remediator.step([]) if a.node in (node, "")]
    finally:
        remediator.close()
    lines, rc = report(node, mode, actions, remediator.faults.get(node, ()), remediator.state, remediator.results)
    print("\n".join(lines))
    return rc


def report(node: str, mode: str, actions: Any, faults: Any, state: Any,
           results: Any = None) -> tuple[list[str], int]:
    """What one run saw and did, a line each, and the exit status: what the agent reports is said whatever the
    guard decided to do about it, and a drain is said done only when the scheduler took it. 0: healthy, or
    held (dry run: would be held) as the faults ask; 1: faulty and not held out of service by this check
    (refused, breaker open, someone else's drain), or a scheduler call failed."""
    lines = []
    failed = False
    for a in actions:
        verb = ("would " if a.dry_run and a.kind in ("drain", "resume", "undo") else "") + a.kind
        result = (results or {}).get(id(a), "ok")
        if result != "ok":
            failed = True
            verb += f" FAILED ({result})"
        lines.append(f"{node}: {verb}: {a.why}" if a.node else f"{verb}: {a.why}")
    held = state.records.get(node)
    seen = "; ".join(dict.fromkeys(f.detail for f in faults))
    if held is not None and held.phase == "draining" and not held.dry_run:
        lines.append(f"{node}: FAULTY, drain not done yet (retried at the next run): {held.reason} ({mode})")
        failed = True
    elif held is not None:
        lines.append(f"{node}: {'would be held' if held.dry_run else 'held'} out of service: {held.reason} ({mode})")
    elif faults:
        why = ("circuit breaker open: " + state.breaker.why if state.breaker is not None
               else "not drained by this check")
        lines.append(f"{node}: FAULTY: {seen}; {why} ({mode})")
    else:
        lines.append(f"{node}: healthy ({mode})")
    faulty_not_held = bool(faults) and held is None
    return lines, 1 if failed or faulty_not_held else 0


def _read_agent(url: str, node: str) -> Any:
    """The agent's reading (GPUs, firing alerts) named `node`, or one line saying why there is none."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from gpumond.rules.telemetry.mapping import read_agent
    from gpumond.rules.telemetry.scrape import wanted_lines

    from gpumond.web.client import Access, http_client

    try:
        with http_client(Access(), timeout=5.0) as client:  # gpumond's one way to build a client
            r = client.get(f"{url.rstrip('/')}/metrics")
    except httpx.HTTPError as e:
        return f"{type(e).__name__}: {e}"
    if r.status_code != 200:
        return f"HTTP {r.status_code}"
    try:
        families = list(text_string_to_metric_families(wanted_lines(r.text)))
    except Exception as e:  # noqa: BLE001 - the parser raises several types on garbage
        return f"unparsable exposition ({e})"
    return read_agent(families, t=time.time(), fallback_node=node, node=node)
