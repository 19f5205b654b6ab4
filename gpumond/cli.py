"""The `gpumond` command line: one subcommand per daemon or tool."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from gpumond import __version__, health_check, remediation_cli
from gpumond.alerts_cli import AGENT_URL
from gpumond.alerts.catalogue import FINDING_KINDS
from gpumond.findings_cli import RULES_URL, base_url

log = logging.getLogger("gpumond")

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line that says what to do (exit 2), not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see: {self.prog} --help)\n")


def _whole_number(lo: int, hi: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number from lo to hi, refused in one line that says the range (and why)."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be from {lo} to {hi}{why}, got {v}")
        return v

    return parse


_positive_int = _whole_number(1, 1024)
_demo_nodes = _whole_number(3, 1024, " (the planted faults sit on nodes 0, 1 and 2)")


def _speed(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 < v <= 100_000:
        raise argparse.ArgumentTypeError(f"must be > 0 and <= 100000, got {v:g}")
    return v


def _base_url(default_port: int) -> Callable[[str], str]:
    """An argparse type for a daemon's base URL; the error says what to type instead."""
    def parse(text: str) -> str:
        try:
            return base_url(text, default_port)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


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


def build_parser() -> argparse.ArgumentParser:
    """The whole CLI, with help that teaches."""
    p = _Parser(prog="gpumond", description="GPU-fleet telemetry, thermal management and straggler detection.",
                epilog=("Try it without a GPU:  gpumond agent --sim 8   then   curl localhost:9480/metrics\n"
                        "Or the whole system on simulated nodes:  gpumond demo\n\n"
                        "exit status: 0 done; 1 the work could not be done (a port in use, a service that could not\n"
                        "be asked, a planted demo fault not found); 2 a bad flag or config (a daemon stops: the\n"
                        "systemd units do not restart it); 130 the demo interrupted"),
                formatter_class=argparse.RawDescriptionHelpFormatter)
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
                "  gpumond agent --sim 8 --sim-scenario demo --sim-speed 10   # a shipped scenario, from any "
                "directory\n"
                "  gpumond agent --sim 4 --sim-scenario ./my-faults.yaml\n"
                "  gpumond alerts                                  # what this agent is alerting on\n"
                f"\nshipped scenarios (in {_SCENARIO_DIR}):\n"
                + "".join(f"  {name:<10}{about}\n" for name, about in _shipped_scenarios().items())),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--config", metavar="FILE", type=Path, help="agent YAML config (every key optional)")
    a.add_argument("--listen", metavar="HOST:PORT", help="override `listen` (default 0.0.0.0:9480)")
    a.add_argument("--node-name", metavar="NAME", help="override `node_name` (default: hostname)")
    a.add_argument("--state-dir", metavar="DIR", help="override `state_dir` (default /var/lib/gpumond; with --sim, a "
                                                      "directory of the run's own); one live agent per directory")
    a.add_argument("--sim", metavar="GPUS", type=_positive_int,
                   help="run on N simulated GPUs instead of the NVIDIA driver (explicit, never a fallback; "
                        "--sim-scenario alone simulates 8)")
    a.add_argument("--sim-scenario", metavar="FILE", type=_scenario,
                   help="YAML faults injected into the simulated GPUs over time (see docs/simulator.md): a file, "
                        "or the name of a shipped scenario (listed below) when no such file exists")
    a.add_argument("--sim-speed", metavar="X", type=_speed,
                   help="run simulated time X times faster than wall time (default 1); with --sim or "
                        "--sim-scenario only")
    a.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="override log.level")
    a.add_argument("--log-format", choices=["logfmt", "json"], help="override log.format")
    _web_flag(a)

    r = sub.add_parser(
        "rules", help="run the central rules service (job pushes, telemetry, findings)",
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
    r.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="override log.level")
    r.add_argument("--log-format", choices=["logfmt", "json"], help="override log.format")
    _web_flag(r)

    d = sub.add_parser(
        "demo", help="run a whole simulated cluster here: agents, a training job with planted faults, findings",
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
    d.add_argument("--nodes", type=_demo_nodes, default=4,
                   help="simulated nodes, 8 GPUs each, 3 to 1024 (default 4)")
    d.add_argument("--duration", type=_speed, default=180.0, metavar="SECONDS",
                   help="the longest it runs before the summary if not everything is found and resolved sooner "
                        "(default 180; Ctrl-C ends it early)")
    d.add_argument("--speed", type=_speed, default=1.0, metavar="X",
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

    f = sub.add_parser(
        "findings", help="print the rules service's current findings as a table",
        description="Ask a rules service (GET /api/v1/findings) for its findings and print them, firing first.",
        epilog=("examples:\n"
                "  gpumond findings                                # the rules service on this machine (:9481)\n"
                "  gpumond findings --url http://rules:9481 --state firing\n"
                "  gpumond findings --job llama-70b-r3 --kind straggler\n"
                "  gpumond findings --json | jq '.findings[].evidence'\n"
                "\nexit status: 0 listed (even none), 1 the service could not be asked, 2 bad flags\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("--url", type=_base_url(9481), default=RULES_URL,
                   help="rules service base URL, http:// or https:// (default %(default)s)")
    f.add_argument("--job", help="only this job")
    # Checked here: the service takes any kind as a filter, and a typo would read as a healthy fleet.
    f.add_argument("--kind", choices=FINDING_KINDS, metavar="KIND",
                   help=f"only this kind: {', '.join(FINDING_KINDS)}")
    f.add_argument("--state", choices=["pending", "firing"], help="only this state")
    f.add_argument("--json", action="store_true", help="print the raw JSON instead of a table")
    _tls_flags(f)

    al = sub.add_parser(
        "alerts", help="print an agent's or the rules service's alerts as a table",
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
    al.add_argument("--url", type=_base_url(9480), default=AGENT_URL,
                    help="base URL of an agent (:9480) or the rules service (:9481), http:// or https:// "
                         "(default %(default)s)")
    al.add_argument("--state", choices=["firing", "pending", "resolved"], help="only alerts in this state")
    al.add_argument("--json", action="store_true", help="print the JSON (after --state) instead of a table")
    _tls_flags(al)

    jb = sub.add_parser(
        "jobs", help="print what each job has used in energy (from the rules service)",
        description=("Ask a rules service (GET /api/v1/jobs) what each job has used: energy, mean power, time\n"
                     "measured, steps completed and energy per step. Running jobs first (most energy first),\n"
                     "then the jobs that ended lately. Energy is counted from the agents' GPU energy counters\n"
                     "while the service saw the job's ranks on those GPUs (docs/rules-api.md)."),
        epilog=("examples:\n"
                "  gpumond jobs                                    # the rules service on this machine (:9481)\n"
                "  gpumond jobs --url http://rules:9481\n"
                "  gpumond jobs --json | jq '.jobs[] | {job, joules_per_step}'\n"
                "\nexit status: 0 listed (even none), 1 the service could not be asked, 2 bad flags\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    jb.add_argument("--url", type=_base_url(9481), default=RULES_URL,
                    help="rules service base URL, http:// or https:// (default %(default)s)")
    jb.add_argument("--json", action="store_true", help="print the raw JSON instead of a table")
    _tls_flags(jb)

    remediation_cli.add_parser(sub)
    health_check.add_parser(sub)

    c = sub.add_parser("check-config", help="validate a config file and exit (0 valid, 2 invalid)",
                       description="Validate an agent or rules config file (the kind is recognised from its "
                                   "keys, else its file name, or given with --kind); prints one line naming the "
                                   "first bad field. By default it checks as the daemon will start: it reads the "
                                   "secret files the config names (tokens_file, *_file) and the GPUMOND_* "
                                   "environment. --shape-only checks keys, types and bounds alone, for a machine "
                                   "that does not hold the secrets (CI). The ok line says which check ran.",
                       epilog=("examples:\n"
                               "  gpumond check-config /etc/gpumond/agent.yaml                  # as the daemon will "
                               "start\n"
                               "  gpumond check-config --shape-only deploy/examples/rules.yaml  # in CI, without the "
                               "secrets\n"),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("file", metavar="FILE", type=Path)
    c.add_argument("--kind", choices=["agent", "rules"], help="which config this is (default: recognise it)")
    c.add_argument("--shape-only", action="store_true",
                   help="check keys, types and bounds only: read no secret file and no GPUMOND_* variable, and "
                        "do not require a push token (they exist only where the daemon runs)")
    return p


def _web_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--web.config.file", dest="web_config_file", metavar="FILE", type=Path,
                   help="TLS and read-side authentication, in Prometheus exporter-toolkit's web config format "
                        "(tls_server_config, basic_auth_users); overrides `web_config_file`; default: plain HTTP "
                        "(see docs/configuration.md#tls-and-authentication)")


def _tls_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ca-file", metavar="FILE", help="https: trust this CA (PEM) instead of the system bundle")
    p.add_argument("--cert-file", metavar="FILE", help="https: present this client certificate (PEM), for a daemon "
                                                        "that requires one; with --key-file")
    p.add_argument("--key-file", metavar="FILE", help="the client certificate's key (PEM)")
    # Credentials come from files, never the command line, where `ps` and shell history would show them.
    p.add_argument("--username", metavar="USER", help="basic auth, for a daemon whose web config has "
                                                       "basic_auth_users; with --password-file")
    p.add_argument("--password-file", metavar="FILE", type=Path, help="the basic-auth password (first line)")
    p.add_argument("--token-file", metavar="FILE", type=Path,
                   help="a bearer token (first line), for a daemon whose web config has bearer tokens")


def _client_access(args: argparse.Namespace, command: str) -> Any:
    """How the read flags say to reach the daemon (TLS context, credentials); one line and exit 2 when bad."""
    from gpumond.findings_cli import Access

    def bad(problem: str) -> SystemExit:
        print(f"gpumond {command}: {problem} (see: gpumond {command} --help)", file=sys.stderr)
        return SystemExit(EXIT_USAGE)

    context = None
    if args.ca_file or args.cert_file or args.key_file:
        from gpumond.job.tlsclient import ClientTLS

        try:
            context = ClientTLS(args.ca_file, args.cert_file, args.key_file).context
        except ValueError as e:
            raise bad(str(e)) from None
    if (args.username is None) != (args.password_file is None):
        raise bad("--username and --password-file go together")
    if args.username is not None and args.token_file is not None:
        raise bad("give basic auth (--username, --password-file) or --token-file, not both")
    headers: dict[str, str] = {}
    secret_file = args.password_file or args.token_file
    if secret_file is not None:
        try:
            secret = (secret_file.read_text(encoding="utf-8").splitlines() or [""])[0].strip()
        except (OSError, UnicodeDecodeError) as e:
            raise bad(f"cannot read {secret_file}: {getattr(e, 'strerror', None) or e}") from None
        if not secret:
            raise bad(f"{secret_file} is empty")
        if args.username is not None:
            import base64

            pair = base64.b64encode(f"{args.username}:{secret}".encode()).decode("ascii")
            headers["Authorization"] = f"Basic {pair}"
        else:
            headers["Authorization"] = f"Bearer {secret}"
    return Access(context, headers)


def _web(path: Path | None) -> Any:
    """The daemon's web config (TLS, read auth), loaded now so that a bad certificate is one line, exit 2."""
    from gpumond.web import load_web

    if path is not None and not path.is_absolute():
        path = path.resolve()
    return load_web(path)


def _innermost(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command parser `args` were parsed by, e.g. the one of `gpumond remediation undo`."""
    for action in parser._actions:  # noqa: SLF001 - argparse offers no public walk of its subparsers
        if isinstance(action, argparse._SubParsersAction) and getattr(args, action.dest, None) in action.choices:
            return _innermost(action.choices[getattr(args, action.dest)], args)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `gpumond` console script."""
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):  # a bare `gpumond` is someone asking what it does
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse would blame `gpumond` and point at the top-level help; name the command given
        _innermost(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "check-config":
        return _check_config(args.file, args.kind, shape_only=args.shape_only)
    if args.command == "agent":
        return _agent(args)
    if args.command == "rules":
        return _rules(args)
    if args.command == "findings":
        return _findings(args)
    if args.command == "jobs":
        return _jobs(args)
    if args.command == "alerts":
        return _alerts(args)
    if args.command == "demo":
        return _demo(args)
    if args.command == remediation_cli.COMMAND:
        return remediation_cli.main(args)
    if args.command == health_check.COMMAND:
        return health_check.main(args)
    return EXIT_USAGE


class _FlagError(Exception):
    """A command-line override that does not parse; the message is the one line to print."""


def _with_flags(cfg: Any, command: str, args: argparse.Namespace,
                parsers: Sequence[tuple[str, str | None, Callable[[str], object], str]]) -> Any:
    """`cfg` with validated flag overrides (flag, text, parse, key) and --log-level / --log-format applied."""
    update: dict[str, object] = {}
    for flag, text, parse, key in parsers:
        if text is not None:  # an empty value ("--state-dir $UNSET") is refused by its parser, never skipped
            try:
                update[key] = parse(text)
            except ValueError as e:
                raise _FlagError(f"gpumond {command}: {flag}: {e} (see: gpumond {command} --help)") from None
    log_update = {k: v for k, v in (("level", args.log_level), ("format", args.log_format)) if v}
    if log_update:
        update["log"] = cfg.log.model_copy(update=log_update)
    return cfg.model_copy(update=update)  # every value above is already validated


def _node_name(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty (leave the flag out for the host name)")
    return text


def _directory(text: str) -> Path:
    """--state-dir: made absolute here, from the directory the command runs in (the config wants it absolute
    because a daemon's working directory under systemd is /)."""
    if not text.strip():
        raise ValueError("must be a directory path")
    return Path(text).expanduser().absolute()


def _check_config(path: Path, kind: str | None, *, shape_only: bool = False) -> int:
    from gpumond.config import AgentConfig, ConfigError, load_agent_config, load_config, read_yaml_mapping
    from gpumond.config.kind import guess_kind, other_kind
    from gpumond.config.rules import RulesConfig, load_rules_config
    from gpumond.httpaccess import AccessError

    how = "given"
    # Said on the ok line: a shape-only pass has not proven the daemon can read its secrets.
    mode = "shape only: no secret file or environment read" if shape_only else \
        "full check: secret files and environment read"
    try:
        if kind is None:
            kind, how = guess_kind(path, read_yaml_mapping(path))
        if kind == "rules":
            rules = load_config(path, RulesConfig) if shape_only else load_rules_config(path)
            source = "prometheus" if rules.telemetry.prometheus else "scrape" if rules.telemetry.scrape.enabled \
                else "none"
            tokens = f"{len(rules.tokens)} inline token(s)" if shape_only else f"{len(rules.tokens)} token(s)"
            web = _served(rules.web_config_file, shape_only)  # a full check loads its certificates, as at start
            _client_files(shape_only, alerting=rules.alerting, telemetry=rules.telemetry)
            print(f"{path}: ok (rules config{_told(how)}; listen {rules.listen}, {tokens}, "
                  f"telemetry {source}, alerts to {_sinks(rules.alerting)}{web}; {mode})")
            return 0
        cfg = load_config(path, AgentConfig) if shape_only else load_agent_config(path)
        web = _served(cfg.web_config_file, shape_only)
        _client_files(shape_only, alerting=cfg.alerting, power_slack=cfg.policy.power_slack)
    except AccessError as e:  # a client certificate or secret file the daemon could not use at start
        print(f"gpumond: {path}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ConfigError as e:
        hint = f" (checked as {'a rules' if kind == 'rules' else 'an agent'} config, told by {how}; " \
               f"pass --kind to choose)" if how == "its file name" else ""
        misfiled = other_kind(kind, path, remedy="check it with --kind {kind}") if how == "given" and kind else None
        print(f"gpumond: {misfiled or f'{e}{hint}'}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{path}: ok (agent config{_told(how)}; listen {cfg.listen}, node {cfg.node_name}, "
          f"alerts to {_sinks(cfg.alerting)}{web}; {mode})")
    return 0


def _misfiled(daemon: str, path: Path | None) -> str | None:
    """'…: looks like a rules config (…), not an agent config: …' for a daemon given the other's config."""
    from gpumond.config.kind import other_kind

    return None if path is None else other_kind(daemon, Path(path), remedy="give it to `gpumond {kind}`")


def _served(path: Path | None, shape_only: bool) -> str:
    """'; serves …' for the check-config line: plain HTTP, or TLS and who may connect and read. The web config
    and its certificates are loaded (ConfigError) unless the check is shape-only, which reads no other file."""
    if shape_only:
        return ""
    web = _web(path)
    served = "plain HTTP" if web.tls is None else f"TLS, {web.tls.settings.client_auth_type}"
    return f"; serves {served}" + (", read auth" if web.users or web.tokens else "")


def _client_files(shape_only: bool, *, alerting: Any, telemetry: Any = None, power_slack: Any = None) -> None:
    """A full check reads what the daemon's HTTP clients read at start (gpumond.httpaccess): the Alertmanager
    sink's, the telemetry sources' and the agent's power-slack client's certificate and secret files;
    AccessError naming the key."""
    if shape_only:
        return
    from gpumond.httpaccess import AccessError, build_access

    clients = {"alerting.alertmanager": alerting.alertmanager}
    if telemetry is not None:
        clients |= {"telemetry.scrape": telemetry.scrape, "telemetry.prometheus": telemetry.prometheus}
    if power_slack is not None and power_slack.rules_url is not None:
        clients["policy.power_slack"] = power_slack
    for key, spec in clients.items():
        if spec is not None:
            try:
                build_access(spec)
            except AccessError as e:
                raise AccessError(f"{key}.{e}") from None


def _told(how: str) -> str:
    """Say so when only the file name told the kind: the operator can then correct it with --kind."""
    return ", told by its file name" if how == "its file name" else ""


def _sinks(alerting: Any) -> str:
    """The sinks an `alerting:` section turns on, for the check-config line (never a secret)."""
    names = ["log"]
    if alerting.alertmanager is not None:
        names.append(f"alertmanager ×{len(alerting.alertmanager.urls)}")
    names += [n for n in ("slack", "pagerduty") if getattr(alerting, n) is not None]
    return ", ".join(names)


def _rules(args: argparse.Namespace) -> int:
    from gpumond.config import ConfigError, ListenAddress
    from gpumond.config.rules import Shard, load_rules_config
    from gpumond.logs import setup_logging
    from gpumond.serving import ListenError

    try:
        cfg = load_rules_config(args.config)
    except ConfigError as e:
        print(f"gpumond: {_misfiled('rules', args.config) or e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        cfg = _with_flags(cfg, "rules", args, (("--listen", args.listen, ListenAddress.parse, "listen"),
                                               ("--shard", args.shard, Shard.parse, "shard"),
                                               ("--state-dir", args.state_dir, _directory, "state_dir")))
    except _FlagError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    try:
        web = _web(args.web_config_file or cfg.web_config_file)
    except ConfigError as e:
        print(f"gpumond: {e}", file=sys.stderr)
        return EXIT_USAGE
    setup_logging(cfg.log.level, cfg.log.format)
    from gpumond.rules.service import RulesService, RulesStartError, serve

    try:
        serve(RulesService(cfg, web=web))
    except RulesStartError as e:
        print(f"gpumond: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ListenError as e:
        print(f"gpumond: {e} (choose another port with --listen)", file=sys.stderr)
        return 1
    return 0


def _demo(args: argparse.Namespace) -> int:
    from gpumond.demo.plan import DemoPlan
    from gpumond.demo.run import run_demo
    from gpumond.logs import setup_logging

    from pydantic import ValidationError

    from gpumond.config import ConfigError
    from gpumond.config.alerting import AlertingConfig, resolve_alerting
    from gpumond.config.errors import validation_problem
    from gpumond.demo.pages import Pages

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


def _findings(args: argparse.Namespace) -> int:
    import json

    from gpumond.findings_cli import FetchError, fetch, known, table

    filters = {"job": args.job, "kind": args.kind, "state": args.state}
    try:
        access = _client_access(args, "findings")
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


def _jobs(args: argparse.Namespace) -> int:
    import json

    from gpumond.findings_cli import FetchError
    from gpumond.jobs_cli import fetch, table

    try:
        jobs = fetch(args.url, access=_client_access(args, "jobs"))
    except FetchError as e:
        print(f"gpumond jobs: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"jobs": jobs}, indent=1) if args.json else table(jobs))
    return 0


def _alerts(args: argparse.Namespace) -> int:
    import json

    from gpumond.alerts_cli import fetch, table
    from gpumond.findings_cli import FetchError

    try:
        alerts = fetch(args.url, args.state, access=_client_access(args, "alerts"))
    except FetchError as e:
        print(f"gpumond alerts: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"alerts": alerts}, indent=1) if args.json else table(alerts))
    return 0


def _agent(args: argparse.Namespace) -> int:
    from gpumond.agent.app import Agent, AgentStartError, serve
    from gpumond.agent.backends import BackendError, real_backend, sim_backend
    from gpumond.config import ConfigError, ListenAddress, load_agent_config
    from gpumond.logs import setup_logging
    from gpumond.serving import ListenError

    if args.sim_speed is not None and not (args.sim or args.sim_scenario):
        # without them the agent reads the real driver, where there is no simulated time to speed up
        print("gpumond agent: --sim-speed: applies to simulated GPUs only; add --sim N (see: gpumond agent --help)",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        cfg = load_agent_config(args.config)
    except ConfigError as e:
        print(f"gpumond: {_misfiled('agent', args.config) or e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        cfg = _with_flags(cfg, "agent", args, (("--listen", args.listen, ListenAddress.parse, "listen"),
                                               ("--node-name", args.node_name, _node_name, "node_name"),
                                               ("--state-dir", args.state_dir, _directory, "state_dir")))
    except _FlagError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    try:
        web = _web(args.web_config_file or cfg.web_config_file)
    except ConfigError as e:
        print(f"gpumond: {e}", file=sys.stderr)
        return EXIT_USAGE
    setup_logging(cfg.log.level, cfg.log.format)
    try:
        if args.sim or args.sim_scenario:
            backend = sim_backend(args.sim, args.sim_scenario, args.sim_speed or 1.0, cfg.node_name)
        else:
            backend = real_backend()
    except BackendError as e:
        print(f"gpumond: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        serve(Agent(cfg, backend, web=web))
    except AgentStartError as e:
        print(f"gpumond: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ListenError as e:
        print(f"gpumond: {e} (is another agent running? choose another port with --listen)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
