"""`gpumond agent`: the per-node NVML agent and Prometheus exporter, on the real driver or simulated GPUs."""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from gpumond.cli.common import EXIT_USAGE, directory, speed, whole_number
from gpumond.cli.daemon import Daemon, Override, StartError, add_daemon_flags, start

COMMAND = "agent"
# Scenarios ship inside the package, so `--sim-scenario demo` works wherever the agent is started.
_SCENARIO_DIR = Path(str(resources.files("gpumond").joinpath("nvml/sim/scenarios")))


def _shipped_scenarios() -> dict[str, str]:
    """Shipped scenario name -> its first comment line (what it does)."""
    shipped = {}
    for path in sorted(_SCENARIO_DIR.glob("*.yaml")):
        try:
            first = path.read_text(encoding="utf-8").partition("\n")[0]
        except (OSError, UnicodeDecodeError):
            first = ""
        shipped[path.stem] = first.lstrip("# ") if first.startswith("#") else ""
    return shipped


def _scenario(text: str) -> Path:
    """--sim-scenario: a file when it exists, else a shipped scenario's name (`demo` or `demo.yaml`)."""
    path = Path(text)
    if path.exists() or path.name != text:  # an existing file, or a path with directories: taken as given
        return path
    shipped = _SCENARIO_DIR / (text if text.endswith(".yaml") else f"{text}.yaml")
    if shipped.is_file():
        return shipped
    names = ", ".join(_shipped_scenarios()) or "none installed"
    raise argparse.ArgumentTypeError(f"{text}: no such file here and no shipped scenario of that name "
                                     f"(shipped: {names}); give a path or one of those names")


def add_parser(sub: Any) -> None:
    """Register `gpumond agent` on the CLI's subparsers."""
    a = sub.add_parser(
        COMMAND, help="run the per-node NVML agent and Prometheus exporter",
        description="Poll NVML on this node and serve Prometheus metrics on /metrics (default port 9480).",
        epilog=("examples:\n"
                "  gpumond agent                                   # real GPUs, defaults\n"
                "  gpumond agent --config /etc/gpumond/agent.yaml\n"
                "  gpumond agent --sim 8                           # 8 simulated GPUs, no driver needed\n"
                "  gpumond agent --sim 8 --sim-scenario demo --sim-speed 10   # a shipped scenario, from any "
                "directory\n"
                "  gpumond agent --sim 4 --sim-scenario ./my-faults.yaml\n"
                "  gpumond alerts                                  # what this agent is alerting on\n"
                f"\nshipped scenarios (in {_SCENARIO_DIR}):\n"
                + "".join(f"  {name:<10}{about}\n" for name, about in _shipped_scenarios().items())),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--config", metavar="FILE", type=Path, help="agent YAML config (every key optional)")
    a.add_argument("--listen", metavar="HOST:PORT", help="override `listen` (default 0.0.0.0:9480)")
    a.add_argument("--relay-listen", metavar="HOST:PORT",
                   help="override `relay.listen`, where this node's ranks push (default 127.0.0.1:9482; loopback "
                        "or the node's own address, never a wildcard); the relay runs when `relay.upstream` is set")
    a.add_argument("--node-name", metavar="NAME", help="override `node_name` (default: hostname)")
    a.add_argument("--state-dir", metavar="DIR", help="override `state_dir` (default /var/lib/gpumond; with --sim, a "
                                                      "directory of the run's own); one live agent per directory")
    a.add_argument("--sim", metavar="GPUS", type=whole_number(1, 1024),
                   help="run on N simulated GPUs instead of the NVIDIA driver (explicit, never a fallback; "
                        "--sim-scenario alone simulates 8)")
    a.add_argument("--sim-scenario", metavar="FILE", type=_scenario,
                   help="YAML faults injected into the simulated GPUs over time (see docs/simulator.md): a file, "
                        "or the name of a shipped scenario (listed below) when no such file exists")
    a.add_argument("--sim-speed", metavar="X", type=speed,
                   help="run simulated time X times faster than wall time (default 1); with --sim or "
                        "--sim-scenario only")
    add_daemon_flags(a)
    a.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run `gpumond agent` until a signal."""
    if args.sim_speed is not None and not (args.sim or args.sim_scenario):
        # without them the agent reads the real driver, where there is no simulated time to speed up
        print("gpumond agent: --sim-speed: applies to simulated GPUs only; add --sim N (see: gpumond agent --help)",
              file=sys.stderr)
        return EXIT_USAGE
    from gpumond.config import load_agent_config

    return start(Daemon(COMMAND, load_agent_config, _overrides, _serve,
                        port_hint="is another agent running? choose another port with --listen"), args)


def _overrides(args: argparse.Namespace) -> list[Override]:
    from gpumond.config import ListenAddress

    return [("--listen", args.listen, ListenAddress.parse, "listen"),
            ("--relay-listen", args.relay_listen, _relay_listen, "relay.listen"),
            ("--node-name", args.node_name, _node_name, "node_name"),
            ("--state-dir", args.state_dir, directory, "state_dir")]


def _relay_listen(text: str) -> Any:
    from gpumond.config import ListenAddress
    from gpumond.config.agent import relay_listen_problem

    address = ListenAddress.parse(text)
    problem = relay_listen_problem(address)
    if problem is not None:
        raise ValueError(problem)
    return address


def _node_name(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty (leave the flag out for the host name)")
    return text


def _serve(cfg: Any, web: Any, args: argparse.Namespace) -> None:
    from gpumond.agent.app import Agent, AgentStartError, serve
    from gpumond.agent.backends import BackendError, real_backend, sim_backend

    try:
        if args.sim or args.sim_scenario:
            backend = sim_backend(args.sim, args.sim_scenario, args.sim_speed or 1.0, cfg.node_name)
        else:
            backend = real_backend()
        serve(Agent(cfg, backend, web=web))
    except (AgentStartError, BackendError) as e:
        raise StartError(str(e)) from None
