"""`gpumond alerts`: an agent's or the rules service's alerts as a terminal table (stdlib only)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from gpumond.cli.read import AGENT_URL, ANONYMOUS, Access, FetchError, access_of, add_access_flags, ago, get_json, render, \
    short, url_type

COMMAND = "alerts"
COLUMNS = ("ALERTNAME", "SEVERITY", "STATE", "NODE", "GPU", "JOB", "RANK", "SINCE", "SUMMARY")
STATES = ("firing", "pending", "resolved")
_SEVERITIES = ("critical", "error", "warning", "info")
DAEMON = "a gpumond agent (:9480) or rules service (:9481)"


def add_parser(sub: Any) -> None:
    """Register `gpumond alerts` on the CLI's subparsers."""
    al = sub.add_parser(
        COMMAND, help="print an agent's or the rules service's alerts as a table",
        description=("Ask a gpumond daemon (GET /api/v1/alerts) for its alerts and print them: firing first,\n"
                     "then pending, then resolved. Both daemons serve alerts:\n"
                     "  the agent on each GPU node, port 9480: thermal, XID, ECC, lost-GPU alerts\n"
                     "  the rules service, port 9481: straggler, I/O-starved and hung-job alerts\n"
                     "SINCE is how long an alert has been in its state (resolved: since it ended)."),
        epilog=("examples:\n"
                "  gpumond alerts                                  # the agent on this node (:9480)\n"
                "  gpumond alerts --url http://gpu-node-03:9480 --state firing\n"
                "  gpumond alerts --url http://rules:9481          # the rules service's alerts\n"
                "  gpumond alerts --json | jq '.alerts[].labels'\n"
                "\nexit status: 0 listed (even none), 1 the daemon could not be asked, 2 bad flags\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    al.add_argument("--url", type=url_type(9480), default=AGENT_URL,
                    help="base URL of an agent (:9480) or the rules service (:9481), http:// or https:// "
                         "(default %(default)s)")
    al.add_argument("--state", choices=["firing", "pending", "resolved"], help="only alerts in this state")
    al.add_argument("--json", action="store_true", help="print the JSON (after --state) instead of a table")
    add_access_flags(al)
    al.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run `gpumond alerts`."""
    try:
        alerts = fetch(args.url, args.state, access=access_of(args, COMMAND))
    except FetchError as e:
        print(f"gpumond alerts: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"alerts": alerts}, indent=1) if args.json else table(alerts))
    return 0


def fetch(url: str, state: str | None = None, timeout_s: float = 5.0,
          access: Access = ANONYMOUS) -> list[dict[str, Any]]:
    """The alerts of the daemon at `url` (GET /api/v1/alerts), only `state` when given; raises FetchError."""
    alerts = get_json(url, "/api/v1/alerts", "alerts", daemon=DAEMON, timeout_s=timeout_s, access=access)
    return [a for a in alerts if state is None or a.get("state") == state]


def _unix(rfc3339: Any) -> float | None:
    """RFC 3339 text ("2025-11-21T21:20:00.000Z") as Unix seconds; None when absent or unreadable."""
    if not isinstance(rfc3339, str):
        return None
    try:
        return datetime.fromisoformat(rfc3339).timestamp()
    except ValueError:
        return None


def _rank(order: Sequence[str], value: Any) -> int:
    return order.index(value) if value in order else len(order)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def _gpu(labels: Mapping[str, Any]) -> str:
    """The GPU index when the alert has one, else its UUID shortened."""
    if labels.get("gpu") not in (None, ""):
        return str(labels["gpu"])
    return short(_text(labels.get("uuid") or labels.get("gpu_uuid")), 16)


def table(alerts: Sequence[Mapping[str, Any]], now: float | None = None) -> str:
    """Alerts as aligned text columns: firing, then pending, then resolved; most severe and oldest first.

    SINCE is how long the alert has been in its state: since it started (pending or firing), or
    since it ended (resolved).
    """
    now = time.time() if now is None else now

    def since(a: Mapping[str, Any]) -> float | None:
        return _unix(a.get("endsAt") if a.get("state") == "resolved" else a.get("startsAt"))

    def order(a: Mapping[str, Any]) -> tuple[int, int, float, str]:
        labels = _mapping(a.get("labels"))
        return (_rank(STATES, a.get("state")), _rank(_SEVERITIES, labels.get("severity")),
                since(a) or 0.0, str(labels.get("alertname")))

    rows = []
    for a in sorted(alerts, key=order):
        labels = _mapping(a.get("labels"))
        summary = _mapping(a.get("annotations")).get("summary")
        rows.append((_text(labels.get("alertname")), _text(labels.get("severity")), _text(a.get("state")),
                     _text(labels.get("node")), _gpu(labels), _text(labels.get("job")), _text(labels.get("rank")),
                     ago(since(a), now), short(_text(summary), 80)))
    return render(COLUMNS, rows, "no alerts")
