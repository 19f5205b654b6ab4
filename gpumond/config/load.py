"""Read config files from disk into validated models; the only place that opens them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from gpumond.config.agent import AgentConfig
from gpumond.config.alerting import resolve_alerting
from gpumond.config.errors import ConfigError, validation_problem
from gpumond.wire.safetext import one_line

M = TypeVar("M", bound=BaseModel)
# What a config (or simulator scenario) file may hold. An agent config costs ~0.25 s and ~25 MiB to load per MiB
# of YAML (benchmarks/results/config_size.md); the largest real one, a fleet-wide power_limit.per_gpu table of UUIDs,
# is ~52 bytes a GPU. Past this the file is a mistake, and reading it would hold the daemon's start.
MAX_FILE_BYTES = 4 * 2**20


def load_agent_config(path: str | Path | None) -> AgentConfig:
    """Load and validate an agent config; None means all defaults. Raises ConfigError."""
    cfg = AgentConfig.default() if path is None else load_config(path, AgentConfig)
    return cfg.model_copy(update={"alerting": resolve_alerting(cfg.alerting, str(path or "agent config"))})


def load_config(path: str | Path, model: type[M]) -> M:
    """Validate the YAML file at `path` as `model`; an empty file gives the defaults."""
    source = str(path)
    data = read_yaml_mapping(path)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(source, validation_problem(err, model)) from None


def read_yaml_mapping(path: str | Path) -> dict[Any, Any]:
    """Parse a YAML file whose top level is a mapping (or empty). Raises ConfigError."""
    source = str(path)
    try:
        with Path(path).open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise ConfigError(source, f"cannot read: {err.strerror or err}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(source, f"larger than the {MAX_FILE_BYTES // 2**20} MiB a config or scenario file may "
                                  "be: is it the file you meant? (a power_limit.per_gpu table for every GPU of an "
                                  "80,000-GPU fleet fits)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(source, f"cannot read: not UTF-8 text (byte {err.start})") from None
    try:
        data = load_yaml(text)
    except yaml.MarkedYAMLError as err:
        raise ConfigError(source, _yaml_problem(err)) from None
    except yaml.YAMLError as err:
        raise ConfigError(source, f"could not parse YAML: {one_line(err)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(source, f"top level must be a mapping of keys (got {_kind(data)})")
    return data


def load_yaml(text: str) -> Any:
    """yaml.safe_load, except that a key given twice in one mapping is an error (yaml.YAMLError).

    Parsed by libyaml where PyYAML has it: the pure-Python scanner took ~97 % of loading a large config (a
    per_gpu table of 34,000 UUIDs: 5 s). A document libyaml refuses is read again by the pure-Python parser, so
    an error says what it always said (its wording and marks are the ones the config errors quote).
    """
    if _FastUniqueKeyLoader is not None:
        try:
            return yaml.load(text, Loader=_FastUniqueKeyLoader)  # noqa: S506 - a CSafeLoader subclass
        except yaml.YAMLError:
            pass
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


class _UniqueKeys:
    """safe_load's constructors, but a key given twice in one mapping is an error.

    PyYAML keeps the last duplicate silently; two `sampling:` blocks would then drop the
    first one without a word, which is exactly the kind of typo the config must catch.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[tuple[str, str], yaml.Mark] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = (key_node.tag, key_node.value)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"duplicate key {key_node.value!r} (first on line {seen[key].line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


class _UniqueKeyLoader(_UniqueKeys, yaml.SafeLoader):
    """The pure-Python parser: the one whose error messages the config errors quote."""


# libyaml's parser with the same constructors and resolver, where PyYAML was built with it.
_FastUniqueKeyLoader: type | None = (type("_FastUniqueKeyLoader", (_UniqueKeys, yaml.CSafeLoader), {})
                                     if yaml.__with_libyaml__ else None)


def _yaml_problem(err: yaml.MarkedYAMLError) -> str:
    mark = err.problem_mark or err.context_mark
    problem = one_line(": ".join(p for p in (err.context, err.problem) if p))
    where = f"line {mark.line + 1}: " if mark else ""
    return f"{where}could not parse YAML: {problem}"


def _kind(value: Any) -> str:
    names = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
    return names.get(type(value), type(value).__name__)
