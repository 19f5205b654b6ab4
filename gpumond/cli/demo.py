"""`gpumond demo`: a whole simulated cluster on this machine (agents, a training job with planted faults, the rules
service), its story printed as it happens."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from gpumond.cli.common import EXIT_USAGE, speed, whole_number

COMMAND = "demo"


def add_parser(sub: Any) -> None:
    """Register `gpumond demo` on the CLI's subparsers."""
    d = sub.add_parser(
        COMMAND, help="run a whole simulated cluster here: agents, a training job with planted faults, findings",
        description="Start simulated GPU nodes (agents), the rules service and a synchronous training job with "
                    "planted faults (a GPU losing cooling, a starved data loader, an XID); print each policy "
                    "action, alert and finding as it happens, with the node, GPU index and rank it concerns; "
                    "end once every planted fault is found and resolved (about 2 minutes) with a summary of "
                    "planted faults against what fired. Each alert also pages: with no flags, Slack- and "
                    "PagerDuty-shaped notifications go to a built-in receiver and are printed as PAGE lines as "
                    "they fire and resolve. No GPU needed. Exit status: 0 every fault found, "
                    "1 one was missed, 130 interrupted.",
        epilog=("examples:\n"
                "  gpumond demo                                          # pages printed from a built-in receiver\n"
                "  gpumond demo --slack-webhook https://hooks.slack.com/services/T…/B…/…\n"
                "  gpumond demo --pagerduty-routing-key 0123456789abcdef0123456789abcdef\n"
                "  gpumond demo --alertmanager http://127.0.0.1:9093   # repeat for every replica\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--nodes", type=whole_number(3, 1024, " (the planted faults sit on nodes 0, 1 and 2)"), default=4,
                   help="simulated nodes, 8 GPUs each, 3 to 1024 (default 4)")
    d.add_argument("--duration", type=speed, default=180.0, metavar="SECONDS",
                   help="the longest it runs before the summary if not everything is found and resolved sooner "
                        "(default 180; Ctrl-C ends it early)")
    d.add_argument("--speed", type=speed, default=1.0, metavar="X",
                   help="run the simulated GPUs' physics (heating, thermal control, alert holds) X times faster; "
                        "the job and the faults' times stay in real seconds (default 1)")
    d.add_argument("--keep", action="store_true",
                   help="keep the agents' logs, configs and policy audit logs (path printed at start)")
    d.add_argument("--alertmanager", metavar="URL", action="append", default=[],
                   help="also send every alert to this Alertmanager (repeat for each replica)")
    d.add_argument("--slack-webhook", metavar="URL",
                   help="send Slack notifications to this incoming webhook instead of the built-in receiver")
    d.add_argument("--pagerduty-routing-key", metavar="KEY",
                   help="send PagerDuty events (Events API v2) with this 32-character integration key instead "
                        "of to the built-in receiver")
    d.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo to its summary."""
    from pydantic import ValidationError

    from gpumond.config import ConfigError
    from gpumond.config.alerting import AlertingConfig, resolve_alerting
    from gpumond.config.errors import validation_problem
    from gpumond.demo.pages import Pages
    from gpumond.demo.plan import DemoPlan
    from gpumond.demo.run import run_demo
    from gpumond.logs import setup_logging

    pages = Pages(alertmanager=args.alertmanager, slack_webhook=args.slack_webhook,
                  pagerduty_routing_key=args.pagerduty_routing_key)
    try:  # the flags become the daemons' `alerting:` section: check them as such before anything starts
        resolve_alerting(AlertingConfig.model_validate(pages.alerting()), "flags", {})
    except ConfigError as e:
        print(f"gpumond demo: {_flag_words(e.problem)} (see: gpumond demo --help)", file=sys.stderr)
        return EXIT_USAGE
    except ValidationError as e:
        print(f"gpumond demo: {_flag_words(validation_problem(e, AlertingConfig))} (see: gpumond demo --help)",
              file=sys.stderr)
        return EXIT_USAGE
    setup_logging("error", "logfmt")  # the demo prints its own story; service logs would drown it
    return run_demo(DemoPlan(nodes=args.nodes), duration_s=args.duration, speed=args.speed, keep=args.keep,
                    pages=pages)


def _flag_words(problem: str) -> str:
    """A config path in a problem line, as the demo flag that set it."""
    for key, flag in (("alertmanager.urls", "--alertmanager"), ("slack.webhook_url", "--slack-webhook"),
                      ("pagerduty.routing_key", "--pagerduty-routing-key")):
        problem = re.sub(rf"(alerting\.)?{re.escape(key)}(\[\d+\])?", flag, problem)
    return problem
