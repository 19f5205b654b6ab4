"""`gpumond remediation`: what gpumond drained and why, and the operator's two levers (undo one node, reset
the circuit breaker). It reads the rules service's state directory and leaves requests there
(gpumond.rules.remediation.requests): run it where the service runs (systemd host, `kubectl exec`)."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from pathlib import Path
from typing import Any

from gpumond.alerts.model import rfc3339

COMMAND = "remediation"
DEFAULT_STATE_DIR = Path("/var/lib/gpumond-rules")


def add_parser(sub: Any) -> None:
    """Register `gpumond remediation` on the CLI's subparsers."""
    r = sub.add_parser(
        COMMAND, help="list the nodes gpumond drained and why; undo one; reset the circuit breaker",
        description=("The rules service drains nodes with confirmed faults (remediation: in rules.yaml; dry run\n"
                     "by default) and returns them to service after a hold-down. This command reads its state\n"
                     "directory: run it on the rules host (or `kubectl exec deploy/gpumond-rules -- gpumond ...`).\n"
                     "`undo` and `reset-breaker` leave a request the service carries out at its next step."),
        epilog=("examples:\n"
                "  gpumond remediation list                         # nodes drained (or, dry run, would be)\n"
                "  gpumond remediation list --json\n"
                "  gpumond remediation undo gpu-node-07             # resume it now; left alone until it is clear\n"
                "  gpumond remediation reset-breaker                # after a guard refusal, once understood\n"
                "  gpumond remediation list --state-dir /var/lib/gpumond/health-check   # the health check's, on a node\n"
                "  tail -f /var/lib/gpumond-rules/remediation-audit.jsonl   # every action and refusal\n"
                "\nexit status: 0 done, 1 nothing to do (node not held, breaker closed), 2 bad flags or state dir\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    r.set_defaults(run=run)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state-dir", type=Path, default=None,
                        help=(f"the rules service's state_dir (default: from --config, else {DEFAULT_STATE_DIR}); "
                              "on a node, the health check's: /var/lib/gpumond/health-check"))
    common.add_argument("--config", type=Path, default=None, help="the rules.yaml to take state_dir from")
    actions = r.add_subparsers(dest="remediation_action", metavar="ACTION", required=True)
    ls = actions.add_parser("list", parents=[common], help="nodes gpumond holds out of service, and the breaker")
    ls.add_argument("--json", action="store_true", help="print the state as JSON")
    undo = actions.add_parser("undo", parents=[common], help="return a node gpumond drained to service now")
    undo.add_argument("node", metavar="NODE")
    actions.add_parser("reset-breaker", parents=[common],
                       help="close the circuit breaker the blast-radius guard opened")


def run(args: argparse.Namespace) -> int:
    """Run `gpumond remediation ACTION`."""
    from gpumond.rules.remediation.remediator import records_of
    from gpumond.rules.remediation.requests import write_reset_breaker, write_undo

    state_dir = _state_dir(args)
    if state_dir is None:
        return 2
    if not state_dir.is_dir():
        print(f"gpumond remediation: {state_dir} is not a directory (pass the rules service's state_dir with "
              f"--state-dir or --config)", file=sys.stderr)
        return 2
    loaded = records_of(state_dir)
    for problem in loaded.problems:  # read-only: reported here, set aside by the service at its next start
        print(f"gpumond remediation: warning: state file: {problem}", file=sys.stderr)
    state = loaded.state
    owner = "the health check" if state_dir.name == "health-check" else "the rules service"
    by = getpass.getuser()
    if args.remediation_action == "list":
        print(json.dumps(_as_json(state), indent=1) if args.json else table(state))
        return 0
    if args.remediation_action == "undo":
        if args.node not in state.records:
            print(f"gpumond remediation: gpumond holds no drain on {args.node} (see: gpumond remediation list)",
                  file=sys.stderr)
            return 1
        path = write_undo(state_dir, args.node, by)
        print(f"requested: {owner} returns {args.node} to service at its next step and leaves it alone "
              f"until its faults clear ({path})")
        return 0
    if state.breaker is None:
        print("gpumond remediation: the circuit breaker is closed; nothing to reset", file=sys.stderr)
        return 1
    path = write_reset_breaker(state_dir, by)
    print(f"requested: {owner} closes the circuit breaker at its next {'run' if owner == 'the health check' else 'step'}"
          f" ({path}); it was opened for: {state.breaker.why}")
    return 0


def _state_dir(args: argparse.Namespace) -> Path | None:
    if args.state_dir is not None:
        return args.state_dir
    if args.config is None:
        return DEFAULT_STATE_DIR
    from gpumond.config import ConfigError, load_config
    from gpumond.config.rules import RulesConfig

    try:
        return load_config(args.config, RulesConfig).state_dir
    except ConfigError as e:
        print(f"gpumond remediation: {e}", file=sys.stderr)
        return None


def _as_json(state: Any) -> dict[str, Any]:
    from gpumond.rules.remediation.state import VERSION, dumps_body

    return {"version": VERSION, **dumps_body(state)}


def table(state: Any, now: float | None = None) -> str:
    """The held nodes as a table, the breaker under it."""
    now = time.time() if now is None else now
    rows = [("NODE", "STATE", "POOL", "SINCE", "CONDITIONS", "REASON")]
    for node, r in sorted(state.records.items()):
        what = "would drain (dry run)" if r.dry_run else r.phase
        if r.clear_since is not None and not r.dry_run:
            what += f", clear {now - r.clear_since:.0f} s"
        rows.append((node, what, r.pool or "-", rfc3339(r.since), ",".join(r.conditions), r.reason))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1] for row in rows]
    if len(rows) == 1:
        lines = ["no node is held out of service by gpumond"]
    if state.breaker is not None:
        dry = " (dry run: only imagined)" if state.breaker.dry_run else ""
        lines.append(f"CIRCUIT BREAKER OPEN{dry} since {rfc3339(state.breaker.opened_at)}: {state.breaker.why} "
                     f"(every action stopped; gpumond remediation reset-breaker)")
    return "\n".join(lines)
