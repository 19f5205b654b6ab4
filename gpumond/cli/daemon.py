"""The start-up `gpumond agent` and `gpumond rules` share: their common flags, the config file (a misfiled one
named as such), flag overrides validated like the file, the web config with its certificates, logging; then the
daemon serves until a signal (gpumond.web.serving). A bad config, flag or start is one line and exit 2; a taken
port is exit 1. The daemon's own modules load only once its config is good (`serve` imports them), so a refusal
is quick."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumond.cli.common import EXIT_USAGE

# (flag, the text given or None, its parser, the config key it overrides)
Override = tuple[str, str | None, Callable[[str], object], str]


def add_daemon_flags(p: argparse.ArgumentParser) -> None:
    """--log-level, --log-format and --web.config.file, the flags every daemon takes after its own."""
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="override log.level")
    p.add_argument("--log-format", choices=["logfmt", "json"], help="override log.format")
    p.add_argument("--web.config.file", dest="web_config_file", metavar="FILE", type=Path,
                   help="TLS and read-side authentication, in Prometheus exporter-toolkit's web config format "
                        "(tls_server_config, basic_auth_users); overrides `web_config_file`; default: plain HTTP "
                        "(see docs/configuration.md#tls-and-authentication)")


@dataclass(frozen=True)
class Daemon:
    """What differs between the daemons' start-ups; `start` does the rest."""

    command: str  # "agent" or "rules"
    load: Callable[[Path | None], Any]  # the config loader (reads the file, secrets, environment)
    overrides: Callable[[argparse.Namespace], Sequence[Override]]
    # (config, web, args): serves until a signal; StartError for a daemon that cannot start (exit 2)
    serve: Callable[[Any, Any, argparse.Namespace], None]
    port_hint: str  # said after a listen address that cannot be bound


class FlagError(Exception):
    """A command-line override that does not parse; the message is the one line to print."""


class StartError(Exception):
    """A daemon that cannot start (its state directory, a backend, a certificate); the message is the line."""


def start(daemon: Daemon, args: argparse.Namespace) -> int:
    """Start `daemon` from `args`: the exit status."""
    from gpumond.config import ConfigError
    from gpumond.logs import setup_logging
    from gpumond.web.serving import ListenError

    try:
        cfg = daemon.load(args.config)
    except ConfigError as e:
        print(f"gpumond: {misfiled(daemon.command, args.config) or e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        cfg = with_flags(cfg, daemon.command, args, daemon.overrides(args))
    except FlagError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    try:
        web = load_web(args.web_config_file or cfg.web_config_file)
    except ConfigError as e:
        print(f"gpumond: {e}", file=sys.stderr)
        return EXIT_USAGE
    setup_logging(cfg.log.level, cfg.log.format)
    try:
        daemon.serve(cfg, web, args)
    except StartError as e:
        print(f"gpumond: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ListenError as e:
        print(f"gpumond: {e} ({daemon.port_hint})", file=sys.stderr)
        return 1
    return 0


def with_flags(cfg: Any, command: str, args: argparse.Namespace, overrides: Sequence[Override]) -> Any:
    """`cfg` with validated flag overrides and --log-level / --log-format applied."""
    update: dict[str, object] = {}
    for flag, text, parse, key in overrides:
        if text is not None:  # an empty value ("--state-dir $UNSET") is refused by its parser, never skipped
            try:
                update[key] = parse(text)
            except ValueError as e:
                raise FlagError(f"gpumond {command}: {flag}: {e} (see: gpumond {command} --help)") from None
    log_update = {k: v for k, v in (("level", args.log_level), ("format", args.log_format)) if v}
    if log_update:
        update["log"] = cfg.log.model_copy(update=log_update)
    return _updated(cfg, update)  # every value above is already validated


def _updated(model: Any, update: dict[str, object]) -> Any:
    """`model` with `update` applied, where a key "section.key" replaces one key of a section (--relay-listen)."""
    top = {k: v for k, v in update.items() if "." not in k}
    for key, value in update.items():
        if "." in key:
            section, _, rest = key.partition(".")
            top[section] = _updated(top.get(section, getattr(model, section)), {rest: value})
    return model.model_copy(update=top)


def misfiled(daemon: str, path: Path | None) -> str | None:
    """'…: looks like a rules config (…), not an agent config: …' for a daemon given the other's config."""
    from gpumond.config.kind import other_kind

    return None if path is None else other_kind(daemon, Path(path), remedy="give it to `gpumond {kind}`")


def load_web(path: Path | None) -> Any:
    """The daemon's web config (TLS, read auth), loaded now so that a bad certificate is one line, exit 2."""
    from gpumond.web import load_web as load

    if path is not None and not path.is_absolute():
        path = path.resolve()
    return load(path)
