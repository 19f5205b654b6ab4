"""The `gpumond` command line: one module per command, each adding its own parser and run function.

A command module has `COMMAND`, `add_parser(subparsers)` (which sets `run` as the parsed arguments' default) and
`run(args) -> exit status`. The daemons (`agent`, `rules`) start through one shared start-up (`daemon.py`); the
read commands (`findings`, `jobs`, `alerts`) share one stdlib client (`read.py`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpumond import __version__
from gpumond.cli import agent, alerts, check_config, demo, findings, health_check, jobs, remediation, rules
from gpumond.cli.common import EXIT_USAGE, Parser, innermost

# In the order `gpumond --help` lists them.
COMMANDS = (agent, rules, demo, findings, jobs, alerts, remediation, health_check, check_config)


def build_parser() -> argparse.ArgumentParser:
    """The whole CLI, with help that teaches."""
    p = Parser(prog="gpumond", description="GPU-fleet telemetry, thermal management and straggler detection.",
               epilog=("Try it without a GPU:  gpumond agent --sim 8   then   curl localhost:9480/metrics\n"
                       "Or the whole system on simulated nodes:  gpumond demo\n\n"
                       "exit status: 0 done; 1 the work could not be done (a port in use, a service that could not\n"
                       "be asked, a planted demo fault not found); 2 a bad flag or config (a daemon stops: the\n"
                       "systemd units do not restart it); 130 the demo interrupted"),
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"gpumond {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `gpumond` console script."""
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):  # a bare `gpumond` is someone asking what it does
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse would blame `gpumond` and point at the top-level help; name the command given
        innermost(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    return args.run(args)
