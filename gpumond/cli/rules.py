"""`gpumond rules`: the central rules service (job pushes, telemetry, findings)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpumond.cli.common import directory
from gpumond.cli.daemon import Daemon, Override, StartError, add_daemon_flags, start

COMMAND = "rules"


def add_parser(sub: Any) -> None:
    """Register `gpumond rules` on the CLI's subparsers."""
    r = sub.add_parser(
        COMMAND, help="run the central rules service (job pushes, telemetry, findings)",
        description="Ingest job pushes, read GPU telemetry from agents or Prometheus, and serve findings "
                    "on /api/v1/findings (default port 9481).",
        epilog=("examples:\n"
                "  gpumond rules --config deploy/examples/rules.yaml  # on this machine, next to gpumond agent --sim 8\n"
                "  gpumond rules --config /etc/gpumond/rules.yaml\n"
                "  gpumond rules --config rules.yaml --shard 0/4 --state-dir /var/lib/gpumond-rules-0   # a replica\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--config", metavar="FILE", type=Path, help="rules YAML config (see deploy/examples/rules.yaml)")
    r.add_argument("--listen", metavar="HOST:PORT", help="override `listen` (default 0.0.0.0:9481)")
    r.add_argument("--state-dir", metavar="DIR",
                   help="override `state_dir`, where alert state is kept (default /var/lib/gpumond-rules); one live "
                        "rules service per directory: a second one is refused")
    r.add_argument("--shard", metavar="I/N", help="evaluate only jobs whose id hashes to I modulo N (crc32) and refuse "
                                                  "pushes for other jobs with 421; jobs route with "
                                                  "GPUMOND_SHARDS=N and {shard} in GPUMOND_ENDPOINT")
    add_daemon_flags(r)
    r.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run `gpumond rules` until a signal."""
    from gpumond.config.rules import load_rules_config

    return start(Daemon(COMMAND, load_rules_config, _overrides, _serve, port_hint="choose another port with --listen"),
                 args)


def _overrides(args: argparse.Namespace) -> list[Override]:
    from gpumond.config import ListenAddress
    from gpumond.config.rules import Shard

    return [("--listen", args.listen, ListenAddress.parse, "listen"),
            ("--shard", args.shard, Shard.parse, "shard"),
            ("--state-dir", args.state_dir, directory, "state_dir")]


def _serve(cfg: Any, web: Any, args: argparse.Namespace) -> None:
    from gpumond.rules.service import RulesService, RulesStartError, serve

    try:
        serve(RulesService(cfg, web=web))
    except RulesStartError as e:
        raise StartError(str(e)) from None
