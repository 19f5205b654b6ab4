"""Prometheus file_sd target lists, re-read when the file changes; a broken file keeps the last good list."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import yaml

from gpumond.config.load import load_yaml
from gpumond.rules.telemetry.targets import Target, parse_target
from gpumond.wire.safetext import one_line

# A file_sd list is operator-written and small; refuse anything that looks like a mistake.
MAX_FILE_BYTES = 8 * 1024 * 1024


def parse_file_sd(text: str, *, yaml_syntax: bool = False, defaults: Mapping[str, str] | None = None) -> list[Target]:
    """`[{"targets": ["host:port", …], "labels": {"node": "…"}}, …]` → targets; ValueError naming the fault."""
    try:
        groups = load_yaml(text) if yaml_syntax else json.loads(text)
    except (ValueError, yaml.YAMLError) as e:
        raise ValueError(f"not valid {'YAML' if yaml_syntax else 'JSON'}: {one_line(e)}") from None
    if groups is None and yaml_syntax:
        groups = []  # an empty YAML file is an empty list, as in Prometheus
    if not isinstance(groups, list):
        raise ValueError(f"top level must be a list of target groups, not {type(groups).__name__}")
    out: list[Target] = []
    seen: set[str] = set()
    for i, group in enumerate(groups):
        if not isinstance(group, dict):
            raise ValueError(f"[{i}]: a target group must be an object")
        targets = group.get("targets")
        labels = group.get("labels") or {}
        if not isinstance(targets, list):
            raise ValueError(f"[{i}].targets: must be a list of \"host:port\" strings")
        if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in labels.items()):
            raise ValueError(f"[{i}].labels: must map label names to strings")
        for j, spec in enumerate(targets):
            try:
                target = parse_target(spec, {**(defaults or {}), **labels})
            except ValueError as e:
                raise ValueError(f"[{i}].targets[{j}]: {e}") from None
            if target.url not in seen:  # the first group naming a target wins, as it would be scraped once
                seen.add(target.url)
                out.append(target)
    return out


class FileSD:
    """A file_sd file; `current()` re-reads it only when its mtime or size changed."""

    def __init__(self, path: Path | str, *, stat: Callable[[Path], os.stat_result] = Path.stat,
                 defaults: Mapping[str, str] | None = None) -> None:
        self.path = Path(path)
        self._defaults = dict(defaults or {})  # labels a group's own labels override (the source's scheme)
        self._stat = stat
        self._signature: tuple[int, int] | None = None
        self._targets: list[Target] = []
        self._error: str | None = None

    def current(self) -> tuple[list[Target], str | None]:
        """The last good target list, and an error line while the file is missing or broken."""
        try:
            st = self._stat(self.path)
        except OSError as e:
            self._signature = None  # re-read as soon as it reappears, whatever its mtime
            self._error = f"file_sd {self.path}: cannot read: {e.strerror or e}"
            return list(self._targets), self._error
        signature = (st.st_mtime_ns, st.st_size)
        if signature != self._signature:
            self._signature = signature
            self._reload(st.st_size)
        return list(self._targets), self._error

    def _reload(self, size: int) -> None:
        try:
            if size > MAX_FILE_BYTES:
                raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
            text = self.path.read_text(encoding="utf-8")
            targets = parse_file_sd(text, yaml_syntax=self.path.suffix.lower() in (".yml", ".yaml"),
                                    defaults=self._defaults)
        except (OSError, ValueError) as e:
            # Keep scraping what we knew: a half-written or mistyped file must not empty the fleet.
            self._error = f"file_sd {self.path}: {one_line(e)}; keeping {len(self._targets)} previous targets"
            return
        self._targets, self._error = targets, None
