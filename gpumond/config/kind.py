"""Which kind of config a file is (agent or rules), told from its keys, else its name, for `check-config`."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path

from gpumond.config.agent import AgentConfig
from gpumond.config.errors import ConfigError
from gpumond.config.load import read_yaml_mapping
from gpumond.config.rules import RulesConfig

KINDS = ("agent", "rules")
# From the models, so a key added to either config is recognised without touching this file.
AGENT_ONLY = frozenset(AgentConfig.model_fields) - frozenset(RulesConfig.model_fields)
RULES_ONLY = frozenset(RulesConfig.model_fields) - frozenset(AgentConfig.model_fields)
SHARED = frozenset(AgentConfig.model_fields) & frozenset(RulesConfig.model_fields)


def guess_kind(path: Path, keys: Iterable[object]) -> tuple[str, str]:
    """(kind, how it was told) from the top-level keys, else the file name; ConfigError when neither tells."""
    present = {str(k) for k in keys}
    agent, rules = sorted(present & AGENT_ONLY), sorted(present & RULES_ONLY)
    if agent and rules:
        raise ConfigError(str(path), f"has agent keys ({', '.join(agent)}) and rules keys ({', '.join(rules)}); "
                                     f"an agent and the rules service each take their own file")
    if agent or rules:
        return ("agent", "its keys") if agent else ("rules", "its keys")
    # Only keys both take (listen, state_dir, alerting, log), as the chart's default rules.yaml has: the
    # file's name is the operators' own label (agent.yaml, gpumond-rules.yaml); a guess beyond it would
    # check a rules config as an agent's and pass it.
    named = [k for k in KINDS if k in path.name.lower()]
    if len(named) == 1:
        return named[0], "its file name"
    unknown = sorted(present - AGENT_ONLY - RULES_ONLY - SHARED)
    if unknown:  # a typo in the only key that would have told: name it, as the config's own check would
        known = sorted(AGENT_ONLY | RULES_ONLY | SHARED)
        hints = [f"{k!r}" + (f" (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(k, known, 1)) else "")
                 for k in unknown]
        raise ConfigError(str(path), f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(hints)}: neither an "
                                     f"agent nor a rules config takes it")
    shared = ", ".join(sorted(present & SHARED)) or "no keys"
    raise ConfigError(str(path), f"cannot tell an agent config from a rules config: it sets only keys both take "
                                 f"({shared}); pass --kind agent or --kind rules")


def other_kind(kind: str, path: Path, *, remedy: str) -> str | None:
    """`<path>: looks like a rules config (…), not an agent config: <remedy>` when a file read as `kind` has keys
    only the other kind takes and none of its own, else None: a config given to the wrong daemon otherwise reads
    as a list of unknown keys. `remedy` has `{kind}` for the other kind ("check it with --kind {kind}")."""
    try:
        present = {str(k) for k in read_yaml_mapping(path)}
    except ConfigError:
        return None
    other = "rules" if kind == "agent" else "agent"
    own, theirs = (AGENT_ONLY, RULES_ONLY) if kind == "agent" else (RULES_ONLY, AGENT_ONLY)
    found = sorted(present & theirs)
    if not found or present & own:
        return None
    shown = ", ".join(found[:4]) + (", …" if len(found) > 4 else "")
    return f"{path}: looks like {_a(other)} config ({shown}), not {_a(kind)} config: {remedy.format(kind=other)}"


def _a(kind: str) -> str:
    return "an agent" if kind == "agent" else "a rules"
