"""`gpumond check-config`: validate an agent or rules config file as the daemon will start (or its shape alone)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpumond.cli.common import EXIT_USAGE
from gpumond.cli.daemon import load_web

COMMAND = "check-config"


def add_parser(sub: Any) -> None:
    """Register `gpumond check-config` on the CLI's subparsers."""
    c = sub.add_parser(COMMAND, help="validate a config file and exit (0 valid, 2 invalid)",
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
    c.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run `gpumond check-config`: 0 valid, 2 invalid."""
    return check_config(args.file, args.kind, shape_only=args.shape_only)


def check_config(path: Path, kind: str | None, *, shape_only: bool = False) -> int:
    from gpumond.config import AgentConfig, ConfigError, load_agent_config, load_config, read_yaml_mapping
    from gpumond.config.kind import guess_kind, other_kind
    from gpumond.config.rules import RulesConfig, load_rules_config
    from gpumond.web.client import AccessError

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
        _client_files(shape_only, alerting=cfg.alerting, power_slack=cfg.policy.power_slack, relay=cfg.relay)
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


def _served(path: Path | None, shape_only: bool) -> str:
    """'; serves …' for the check-config line: plain HTTP, or TLS and who may connect and read. The web config
    and its certificates are loaded (ConfigError) unless the check is shape-only, which reads no other file."""
    if shape_only:
        return ""
    web = load_web(path)
    served = "plain HTTP" if web.tls is None else f"TLS, {web.tls.settings.client_auth_type}"
    return f"; serves {served}" + (", read auth" if web.users or web.tokens else "")


def _client_files(shape_only: bool, *, alerting: Any, telemetry: Any = None, power_slack: Any = None,
                  relay: Any = None) -> None:
    """A full check reads what the daemon's HTTP clients read at start (gpumond.web.client): every alert sink's,
    the telemetry sources', the agent's power-slack client's and its relay's certificate and secret files;
    AccessError naming the key."""
    if shape_only:
        return
    from gpumond.web.client import build_access

    clients = {f"alerting.{sink}": getattr(alerting, sink) for sink in ("alertmanager", "slack", "pagerduty")}
    if telemetry is not None:
        clients |= {"telemetry.scrape": telemetry.scrape, "telemetry.prometheus": telemetry.prometheus}
    if power_slack is not None and power_slack.rules_url is not None:
        clients["policy.power_slack"] = power_slack
    if relay is not None and relay.upstream is not None:
        clients["relay"] = relay
    for key, spec in clients.items():
        if spec is not None:
            build_access(spec, key)


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
