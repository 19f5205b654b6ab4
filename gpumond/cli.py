"""The `gpumond` command line: one subcommand per daemon or tool."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from gpumond import __version__

log = logging.getLogger("gpumond")

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line that says what to do (exit 2), not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see: {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if not 1 <= v <= 1024:
        raise argparse.ArgumentTypeError(f"must be from 1 to 1024, got {v}")
    return v


def _speed(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 < v <= 100_000:
        raise argparse.ArgumentTypeError(f"must be > 0 and <= 100000, got {v:g}")
    return v


def build_parser() -> argparse.ArgumentParser:
    """The whole CLI, with help that teaches."""
    p = _Parser(prog="gpumond", description="GPU-fleet telemetry, thermal management and straggler detection.",
                epilog="Try it without a GPU:  gpumond agent --sim 8   then   curl localhost:9480/metrics")
    p.add_argument("--version", action="version", version=f"gpumond {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    a = sub.add_parser(
        "agent", help="run the per-node NVML agent and Prometheus exporter",
        description="Poll NVML on this node and serve Prometheus metrics on /metrics (default port 9480).",
        epilog=("examples:\n"
                "  gpumond agent                                   # real GPUs, defaults\n"
                "  gpumond agent --config /etc/gpumond/agent.yaml\n"
                "  gpumond agent --sim 8                           # 8 simulated GPUs, no driver needed\n"
                "  gpumond agent --sim 8 --sim-scenario demo.yaml --sim-speed 10\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--config", metavar="FILE", type=Path, help="agent YAML config (every key optional)")
    a.add_argument("--listen", metavar="HOST:PORT", help="override `listen` (default 0.0.0.0:9480)")
    a.add_argument("--node-name", metavar="NAME", help="override `node_name` (default: hostname)")
    a.add_argument("--sim", metavar="GPUS", type=_positive_int,
                   help="run on N simulated GPUs instead of the NVIDIA driver (explicit, never a fallback)")
    a.add_argument("--sim-scenario", metavar="FILE", type=Path,
                   help="YAML faults injected into the simulated GPUs over time (see docs/simulator.md)")
    a.add_argument("--sim-speed", metavar="X", type=_speed, default=1.0,
                   help="run simulated time X times faster than wall time (default 1)")
    a.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="override log.level")
    a.add_argument("--log-format", choices=["logfmt", "json"], help="override log.format")

    c = sub.add_parser("check-config", help="validate a config file and exit (0 valid, 2 invalid)",
                       description="Validate an agent config file; prints one line naming the first bad field.")
    c.add_argument("file", metavar="FILE", type=Path)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `gpumond` console script."""
    args = build_parser().parse_args(argv)
    if args.command == "check-config":
        return _check_config(args.file)
    if args.command == "agent":
        return _agent(args)
    return EXIT_USAGE


def _check_config(path: Path) -> int:
    from gpumond.config import ConfigError, load_agent_config

    try:
        cfg = load_agent_config(path)
    except ConfigError as e:
        print(f"gpumond: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{path}: ok (agent config; listen {cfg.listen}, node {cfg.node_name})")
    return 0


def _agent(args: argparse.Namespace) -> int:
    from gpumond.agent.app import Agent, AgentStartError, ListenError, serve
    from gpumond.agent.backends import BackendError, real_backend, sim_backend
    from gpumond.config import ConfigError, load_agent_config
    from gpumond.logs import setup_logging

    from gpumond.config import ListenAddress

    try:
        cfg = load_agent_config(args.config)
    except ConfigError as e:
        print(f"gpumond: {e}", file=sys.stderr)
        return EXIT_USAGE
    update: dict[str, object] = {}
    if args.listen:
        try:
            update["listen"] = ListenAddress.parse(args.listen)
        except ValueError as e:
            print(f"gpumond agent: --listen: {e} (see: gpumond agent --help)", file=sys.stderr)
            return EXIT_USAGE
    if args.node_name:
        update["node_name"] = args.node_name
    log_update = {k: v for k, v in (("level", args.log_level), ("format", args.log_format)) if v}
    if log_update:
        update["log"] = cfg.log.model_copy(update=log_update)
    cfg = cfg.model_copy(update=update)  # values above are already validated
    setup_logging(cfg.log.level, cfg.log.format)
    try:
        if args.sim or args.sim_scenario:
            backend = sim_backend(args.sim, args.sim_scenario, args.sim_speed, cfg.node_name)
        else:
            backend = real_backend()
    except BackendError as e:
        print(f"gpumond: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        serve(Agent(cfg, backend))
    except AgentStartError as e:
        print(f"gpumond: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ListenError as e:
        print(f"gpumond: {e} (is another agent running? choose another port with --listen)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
