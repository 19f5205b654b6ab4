"""`gpumond jobs`: what each job has used in energy, from the rules service (GET /api/v1/jobs). Stdlib only."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gpumond.cli.read import (ANONYMOUS, RULES_URL, Access, FetchError, access_of, add_access_flags, get_json, number,
                              render, url_type)

COMMAND = "jobs"

COLUMNS = ("JOB", "STATE", "ENERGY", "MEAN POWER", "MEASURED", "STEPS", "PER STEP")
PER_SAMPLE = "PER SAMPLE"  # shown only when some job reports samples (the SDK's step_end(samples=…))
DAEMON = "the rules service (`gpumond rules`)"


def add_parser(sub: Any) -> None:
    """Register `gpumond jobs` on the CLI's subparsers."""
    jb = sub.add_parser(
        COMMAND, help="print what each job has used in energy (from the rules service)",
        description=("Ask a rules service (GET /api/v1/jobs) what each job has used: energy, mean power, time\n"
                     "measured, steps completed and energy per step, and per sample for jobs whose SDK is\n"
                     "told each step's samples (or tokens). Running jobs first (most energy first),\n"
                     "then the jobs that ended lately. Energy is counted from the agents' GPU energy counters\n"
                     "while the service saw the job's ranks on those GPUs (docs/rules-api.md)."),
        epilog=("examples:\n"
                "  gpumond jobs                                    # the rules service on this machine (:9481)\n"
                "  gpumond jobs --url http://rules:9481\n"
                "  gpumond jobs --json | jq '.jobs[] | {job, joules_per_step}'\n"
                "\nexit status: 0 listed (even none), 1 the service could not be asked, 2 bad flags\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    jb.add_argument("--url", type=url_type(9481), default=RULES_URL,
                    help="rules service base URL, http:// or https:// (default %(default)s)")
    jb.add_argument("--json", action="store_true", help="print the raw JSON instead of a table")
    add_access_flags(jb)
    jb.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run `gpumond jobs`."""
    try:
        jobs = fetch(args.url, access=access_of(args, COMMAND))
    except FetchError as e:
        print(f"gpumond jobs: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"jobs": jobs}, indent=1) if args.json else table(jobs))
    return 0


def fetch(url: str, timeout_s: float = 5.0, access: Access = ANONYMOUS) -> list[dict[str, Any]]:
    """GET /api/v1/jobs: each job's energy record with its `state` (running or ended); raises FetchError."""
    return get_json(url, "/api/v1/jobs", "jobs", daemon=DAEMON, timeout_s=timeout_s, access=access)


def joules(value: Any) -> str:
    """Energy in the unit a person reads: J, kJ, MJ, or kWh from 3.6 MJ on (what a power bill says)."""
    j = number(value)
    if j is None:
        return "-"
    if j >= 3.6e6:
        return f"{j / 3.6e6:.2f} kWh"
    for scale, unit in ((1e6, "MJ"), (1e3, "kJ")):
        if j >= scale:
            return f"{j / scale:.1f} {unit}"
    return f"{j:.0f} J"


def _per_sample(value: Any) -> str:
    """Energy per sample: often under a joule, so in mJ there (three figures)."""
    j = number(value)
    return f"{j * 1e3:.3g} mJ" if j is not None and j < 1 else joules(j)


def _watts(value: Any) -> str:
    w = number(value)
    return "-" if w is None else (f"{w / 1e3:.2f} kW" if w >= 1e3 else f"{w:.0f} W")


def _duration(value: Any) -> str:
    s = number(value)
    if s is None:
        return "-"
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"


def table(jobs: Sequence[Mapping[str, Any]]) -> str:
    """Running jobs, most energy first, then the ended ones the service still shows, newest first."""
    running = sorted((j for j in jobs if j.get("state") != "ended"), key=lambda j: -(number(j.get("energy_joules")) or 0))
    ended = [j for j in jobs if j.get("state") == "ended"][::-1]
    rows = [(str(j.get("job")), str(j.get("state") or "running"), joules(j.get("energy_joules")),
             _watts(j.get("mean_power_watts")), _duration(j.get("measured_seconds")),
             str(j.get("steps") or "-"), joules(j.get("joules_per_step"))) for j in running + ended]
    columns = COLUMNS
    if any(number(j.get("joules_per_sample")) is not None for j in jobs):
        columns += (PER_SAMPLE,)
        rows = [row + (_per_sample(j.get("joules_per_sample")),) for row, j in zip(rows, running + ended)]
    return render(columns, rows, "no jobs: the rules service has measured no job's energy yet (it needs the "
                                 "job's pushes and GPU telemetry from its nodes' agents)")
