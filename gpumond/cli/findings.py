"""`gpumond findings`: the rules service's current findings as a table (GET /api/v1/findings). Stdlib only."""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
import urllib.error
from collections.abc import Mapping, Sequence
from typing import Any

from gpumond.alerts.catalogue import FINDING_KINDS
from gpumond.cli.read import (ANONYMOUS, MAX_ANSWER_BYTES, RULES_URL, Access, FetchError, access_of, add_access_flags,
                              ago, get_json, number, render, short, url_type)

COMMAND = "findings"
# MEASURE: what made the finding, with its unit: each kind's `score` is a different quantity (a z-score
# against peers, a share of the step, a ratio to the job's baseline), so a bare number would not compare.
COLUMNS = ("KIND", "STATE", "JOB", "NODE", "RANK", "GPU", "MEASURE", "SINCE", "EVIDENCE")


def add_parser(sub: Any) -> None:
    """Register `gpumond findings` on the CLI's subparsers."""
    f = sub.add_parser(
        COMMAND, help="print the rules service's current findings as a table",
        description="Ask a rules service (GET /api/v1/findings) for its findings and print them, firing first.",
        epilog=("examples:\n"
                "  gpumond findings                                # the rules service on this machine (:9481)\n"
                "  gpumond findings --url http://rules:9481 --state firing\n"
                "  gpumond findings --job llama-70b-r3 --kind straggler\n"
                "  gpumond findings --json | jq '.findings[].evidence'\n"
                "\nexit status: 0 listed (even none), 1 the service could not be asked, 2 bad flags\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("--url", type=url_type(9481), default=RULES_URL,
                   help="rules service base URL, http:// or https:// (default %(default)s)")
    f.add_argument("--job", help="only this job")
    # Checked here: the service takes any kind as a filter, and a typo would read as a healthy fleet.
    f.add_argument("--kind", choices=FINDING_KINDS, metavar="KIND",
                   help=f"only this kind: {', '.join(FINDING_KINDS)}")
    f.add_argument("--state", choices=["pending", "firing"], help="only this state")
    f.add_argument("--json", action="store_true", help="print the raw JSON instead of a table")
    add_access_flags(f)
    f.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run `gpumond findings`."""
    filters = {"job": args.job, "kind": args.kind, "state": args.state}
    try:
        access = access_of(args, COMMAND)
        found = fetch(args.url, filters, access=access)
    except FetchError as e:
        print(f"gpumond findings: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"findings": found}, indent=1))
        return 0
    empty = "no findings" + "".join(f" for {k} {v}" for k, v in filters.items() if v)
    if not found:  # "none" means something only when the service has anything to judge: say what it holds
        try:
            empty += f": {known(args.url, access=access)}"
        except FetchError as e:
            empty += f" (what the service holds is unknown: {e})"
    print(table(found, empty=empty))
    return 0


def fetch(url: str, filters: Mapping[str, str | None], timeout_s: float = 5.0,
          access: Access = ANONYMOUS) -> list[dict[str, Any]]:
    """The findings of the rules service at `url`, filtered there; raises FetchError with one line."""
    return get_json(url, "/api/v1/findings", "findings", daemon="the rules service (`gpumond rules`)",
                    query=filters, timeout_s=timeout_s, access=access)


def _pct(value: Any) -> str:
    v = number(value)
    return "?" if v is None else f"{v * 100:.0f}%"


def measure(finding: Mapping[str, Any]) -> str:
    """The finding's score in words with its unit, from the score and the evidence its kind carries."""
    kind, ev = finding.get("kind"), finding.get("evidence") or {}
    score = number(finding.get("score"))
    shown = "?" if score is None else f"{score:.1f}"
    signals = ev.get("signals") if isinstance(ev.get("signals"), Mapping) else {}
    seq = signals.get("sequential") if kind == "straggler" and set(signals) == {"sequential"} else None
    if isinstance(seq, Mapping) and number(seq.get("value")) is not None and number(seq.get("span_s")) is not None:
        # Flagged on sequential evidence alone: its z is per step, not the group threshold's (detectors.md).
        return f"compute ×{number(seq.get('value')):.2f} of peers for {number(seq.get('span_s')):.0f} s"
    if kind in ("straggler", "straggler_node"):
        threshold = number(ev.get("threshold_z"))
        text = f"z {shown} vs peers" + (f" (flags at {threshold:.1f})" if threshold is not None else "")
        if kind == "straggler_node" and "gpus_flagged" in ev:
            text += f", {ev.get('gpus_flagged')}/{ev.get('gpus_on_node', '?')} GPUs"
        return text
    if kind == "io_starved_rank":
        return f"data wait {_pct(ev.get('data_wait_frac'))} of step (peers {_pct(ev.get('peer_median_data_wait_frac'))})"
    if kind == "io_starved_job":
        ranks = f", {ev.get('ranks_starved')}/{ev.get('ranks')} ranks" if "ranks_starved" in ev else ""
        return f"data wait {_pct(ev.get('median_data_wait_frac', score))} of step (median){ranks}"
    if kind == "job_slowdown":
        return f"step time ×{number(ev.get('slowdown')) or score or 0:.2f} of baseline"
    if kind == "hung_rank":
        stalled, limit = number(ev.get("stalled_for_s")), number(ev.get("limit_s"))
        if stalled is not None:
            return f"no step for {stalled:.0f} s" + (f" (limit {limit:.0f} s)" if limit is not None else "")
        return f"stalled ×{shown} of its limit"
    return f"score {shown}"


# Evidence keys MEASURE already shows, left out of the EVIDENCE column.
_IN_MEASURE = {"threshold_z", "gpus_flagged", "gpus_on_node", "data_wait_frac", "peer_median_data_wait_frac",
               "median_data_wait_frac", "ranks_starved", "ranks", "slowdown", "stalled_for_s", "limit_s"}


def _evidence(ev: Mapping[str, Any], width: int = 60) -> str:
    parts = []
    signals = ev.get("signals")
    if isinstance(signals, Mapping):
        for name, sig in signals.items():
            if isinstance(sig, Mapping):
                parts.append(f"{name} {sig.get('value')} vs {sig.get('peer_median')}")
    for key in ("likely_cause", "step_time_s", "baseline_step_time_s", "localised"):
        if key in ev and key not in _IN_MEASURE:
            parts.append(f"{key}={ev[key]}")
    return short("; ".join(parts), width)


def table(findings: Sequence[Mapping[str, Any]], now: float | None = None, empty: str = "no findings") -> str:
    """Findings as aligned text columns: firing first, then by kind, the strongest of a kind first (scores of
    different kinds are different quantities, so they are compared only within a kind)."""
    now = time.time() if now is None else now
    rows = []
    for f in sorted(findings, key=lambda f: (f.get("state") != "firing", str(f.get("kind")),
                                             -(number(f.get("score")) or 0.0))):
        rows.append((str(f.get("kind")), str(f.get("state")), str(f.get("job")), f.get("node") or "-",
                     "-" if f.get("rank") is None else str(f.get("rank")), short(f.get("gpu_uuid") or "-", 16),
                     measure(f), ago(f.get("since"), now), _evidence(f.get("evidence") or {})))
    return render(COLUMNS, rows, empty)


def known(url: str, timeout_s: float = 5.0, access: Access = ANONYMOUS) -> str:
    """What the rules service holds, for a "no findings" line: jobs and ranks pushing, GPU telemetry.

    Read from its /metrics (`gpumond_rules_held`, `gpumond_rules_telemetry_up`); FetchError if unreadable.
    """
    full = url.rstrip("/") + "/metrics"
    try:
        with access.open(full, timeout_s) as resp:
            text = resp.read(MAX_ANSWER_BYTES).decode("utf-8", "replace")
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        raise FetchError(f"cannot read {full}: {getattr(e, 'reason', None) or e}") from None
    from prometheus_client.parser import text_string_to_metric_families  # only for this line: keep start fast

    held: dict[str, float] = {}
    telemetry: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "gpumond_rules_held":
                    held[s.labels.get("kind", "")] = s.value
                elif s.name == "gpumond_rules_telemetry_up":
                    telemetry[s.labels.get("source", "")] = s.value
    except ValueError as e:
        raise FetchError(f"{full}: not Prometheus text ({e})") from None
    jobs, ranks = int(held.get("jobs", 0)), int(held.get("ranks", 0))
    pushed = (f"{jobs} job(s) with {ranks} rank(s) pushing" if jobs else
              # held jobs only: a job that sent `final` or outlived expire_after_s is no longer counted
              "no job is pushing to it (none has yet, or each one ended or fell silent; check GPUMOND_ENDPOINT "
              "and GPUMOND_TOKEN in the training job)")
    if not telemetry:
        gpu = "no GPU telemetry source configured (telemetry: in rules.yaml)"
    else:
        source, up = next(iter(telemetry.items()))
        gpus, nodes = int(held.get("telemetry_gpus", 0)), int(held.get("telemetry_nodes", 0))
        gpu = (f"GPU telemetry ({source}) from {nodes} node(s), {gpus} GPU(s)" if up and gpus else
               f"GPU telemetry ({source}) configured but {'no GPU seen yet' if up else 'its last fetch failed'}")
    return f"{pushed}; {gpu}"

